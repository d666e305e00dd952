package runtime

import (
	"os"
	"testing"
)

func TestUnifiedPath(t *testing.T) {
	for _, tc := range []struct {
		name, procCgroup, want string
		err                    bool
	}{
		{name: "cgroup v2 alone", procCgroup: "0::/system.slice/containerd.service\n", want: "/system.slice/containerd.service"},
		{name: "hybrid", procCgroup: "4:memory:/a\n0::/b\n", want: "/b"},
		{name: "root", procCgroup: "0::/\n", want: "/"},
		{name: "v1 only", procCgroup: "4:memory:/a\n", err: true},
		{name: "empty", procCgroup: "", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := unifiedPath(tc.procCgroup)
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("unifiedPath(%q) = %q, %v; want %q (error %v)", tc.procCgroup, got, err, tc.want, tc.err)
			}
		})
	}
}

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
