package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/pagechain"
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
	return mountPrivateTmpfs(kerndatDir, "cklite-criu-kdat", "size=1m")
}

// keepPagesCache makes sure the cache of decompressed page images restores read
// (pagechain.CacheRoot) is a tmpfs, private to root, mounting one if it is not (once per
// process). Its size is tmpfs's default: the cache bounds itself, and a full tmpfs would fail a
// rollback. Failing costs speed: the cache is then a directory on the disk.
func keepPagesCache() error {
	return mountPrivateTmpfs(pagechain.CacheRoot, "cklite-pages", "")
}

// mountPrivateTmpfs mounts a tmpfs of mode 0700 named source at dir (options opts), unless dir is
// a tmpfs already.
func mountPrivateTmpfs(dir, source, opts string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("directory %s: %w", dir, err)
	}
	// Shims start concurrently; one mounts, the others find its tmpfs.
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(dir), ".criu.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("lock %s: %w", dir, err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", dir, err)
	}
	if onTmpfs(dir) {
		return nil
	}
	data := strings.TrimPrefix(opts+",mode=0700", ",")
	if err := unix.Mount(source, dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, data); err != nil {
		return fmt.Errorf("mount a tmpfs at %s: %w", dir, err)
	}
	return nil
}

func onTmpfs(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.TMPFS_MAGIC
}
