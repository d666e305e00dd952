package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/log"
	"github.com/opencontainers/cgroups"
)

// Moving a process into a cgroup (a pid written into cgroup.procs, v1 or v2) takes the kernel's
// cgroup_threadgroup_rwsem for writing. That per-CPU rwsem is made for its readers (every fork and
// exit): its first writer after a pause waits for an RCU grace period (rcu_sync_enter), 9-11 ms on
// this machine, and the rwsem stays in its writers' mode for about one more grace period after the
// last writer is done (rcu_sync_exit), during which another writer takes 0.15 ms. Every in-place
// restore pays the wait once, in libcontainer's Restore: it moves CRIU into the container's
// cgroups (criuApplyCgroups, the first controller) before it sends CRIU the request. WarmAttach
// starts that wait earlier, beside the rootfs's switch, with one write of the shim into the cgroup
// it is already in (nothing moves; the kernel takes the rwsem all the same): the restore's attach,
// ~10-15 ms later, then finds the rwsem switched, or still switching and waits less. One write, not
// a series: a writer every few milliseconds (tried, docs/performance.md) kept the rwsem in its
// writers' mode throughout and cost more than it saved.

// ownProcs is the cgroup.procs of the cgroup the shim is in, looked up once: the shim does not
// move.
var ownProcs = sync.OnceValues(ownProcsFile)

// WarmAttach writes the calling process into its own cgroup, in the background. It is best
// effort: should the file not be found or written, the restore's attach waits as it did.
func WarmAttach() {
	go func() {
		procs, err := ownProcs()
		if err == nil {
			err = writeSelf(procs)
		}
		if err != nil {
			log.L.WithError(err).Debug("cgroup attach not warmed")
		}
	}()
}

// writeSelf moves the calling process (pid "0": the writer's whole thread group) into the cgroup
// whose cgroup.procs is procs.
func writeSelf(procs string) error {
	f, err := os.OpenFile(procs, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString("0")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// ownProcsFile is the cgroup.procs of the cgroup the calling process is in: in the freezer's v1
// hierarchy (any hierarchy takes the same rwsem), or the unified one.
func ownProcsFile() (string, error) {
	if cgroups.IsCgroup2UnifiedMode() {
		own, err := cgroups.ParseCgroupFile("/proc/self/cgroup")
		if err != nil {
			return "", err
		}
		path, ok := own[""]
		if !ok {
			return "", errors.New("no cgroup v2 path in /proc/self/cgroup")
		}
		return filepath.Join("/sys/fs/cgroup", path, "cgroup.procs"), nil
	}
	dir, err := cgroups.GetOwnCgroupPath("freezer")
	if err != nil {
		return "", fmt.Errorf("own freezer cgroup: %w", err)
	}
	return filepath.Join(dir, "cgroup.procs"), nil
}
