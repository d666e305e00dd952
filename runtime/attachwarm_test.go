package runtime

import (
	"os"
	"testing"
)

// TestWarmAttachMovesNothing writes this test process into its own cgroup as WarmAttach does: the
// write succeeds and its cgroups are the same afterwards, in every hierarchy.
func TestWarmAttachMovesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("writing cgroup.procs needs root")
	}
	before, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	procs, err := ownProcs()
	if err != nil {
		t.Fatal(err)
	}
	if err := writeSelf(procs); err != nil {
		t.Fatalf("write %s: %v", procs, err)
	}
	after, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Fatalf("cgroups changed:\nbefore\n%s\nafter\n%s", before, after)
	}
}
