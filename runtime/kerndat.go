package runtime

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// kerndatDir is where the CRIU that contrib/install.sh builds (CRIU_RUNDIR in
// contrib/versions.env) keeps its kerndat cache, criu.kdat: what CRIU learned about the kernel.
// Without that file every CRIU run probes the kernel again, creating network namespaces and veth
// pairs among other things: ~35 ms of each dump and each restore here, more than a whole dump of
// an idle container takes once the cache exists. CRIU keeps the file only on a tmpfs, so that a
// reboot (a new kernel) drops it; a distribution's CRIU keeps it in /run, which is a tmpfs where
// systemd runs, but not on every host (not on these machines).
const kerndatDir = "/run/cklite/criu"

// keepKerndatCache makes sure kerndatDir is a tmpfs, mounting a small one if it is not (once per
// process: PrepareCRIU's). Failing costs CRIU's probing, not correctness: the caller logs the
// error and goes on.
func keepKerndatCache() error {
	return mountKerndatDir(kerndatDir)
}

func mountKerndatDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("CRIU kerndat cache directory: %w", err)
	}
	// Shims start concurrently; one mounts, the others find its tmpfs.
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(dir), ".criu.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("lock the CRIU kerndat cache directory: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock the CRIU kerndat cache directory: %w", err)
	}
	if onTmpfs(dir) {
		return nil
	}
	if err := unix.Mount("cklite-criu-kdat", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=0700"); err != nil {
		return fmt.Errorf("mount a tmpfs for CRIU's kerndat cache at %s: %w", dir, err)
	}
	return nil
}

func onTmpfs(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.TMPFS_MAGIC
}
