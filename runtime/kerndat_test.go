package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mountPrivateTmpfs mounts one tmpfs of mode 0700 where there is none, and none more when called
// again (as concurrent shims do).
func TestMountPrivateTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := filepath.Join(t.TempDir(), "criu")
	t.Cleanup(func() {
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
	for range 2 {
		if err := mountPrivateTmpfs(dir, "cklite-test", "size=1m"); err != nil {
			t.Fatal(err)
		}
	}
	if !onTmpfs(dir) {
		t.Fatalf("%s is not on a tmpfs", dir)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("%s: %v, mode %v, want 0700", dir, err, st.Mode())
	}
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(info), " "+dir+" "); n != 1 {
		t.Fatalf("%d mounts at %s, want 1", n, dir)
	}
}
