package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/cgroups"
)

// Moving a process into a cgroup (a pid written into cgroup.procs, v1 or v2) takes the kernel's
// cgroup_threadgroup_rwsem for writing. That per-CPU rwsem is made for its readers (every fork and
// exit): its first writer after a pause waits for an RCU grace period, 9-11 ms on this machine,
// and writers that come within about one grace period of the last find it still switched and take
// 0.15 ms. Every restore pays the wait once: libcontainer moves CRIU into the container's cgroups
// before CRIU starts (criuApplyCgroups, the first controller, cpuset, 10-13 ms), kept cgroups or
// new ones alike. An in-place restore knows ~20 ms ahead that it will (the kill, the unmount and
// the switch of the rootfs come first): AttachWarmer pays the grace period while those steps run
// and keeps it paid until the restore begins, by moving the shim into the cgroup it is already in
// every warmEvery (nothing moves; the kernel takes the rwsem all the same).

// warmEvery is well under a grace period, so the rwsem never falls back between two writes.
const warmEvery = 3 * time.Millisecond

// AttachWarmer keeps cgroup attaches fast from WarmAttach to Stop.
type AttachWarmer struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// WarmAttach starts moving the calling process into its own cgroup until Stop. It is best effort:
// should the cgroup file not be found or written, the restore's attach simply waits as before.
func WarmAttach() *AttachWarmer {
	w := &AttachWarmer{stop: make(chan struct{}), done: make(chan struct{})}
	procs, err := ownProcsFile()
	if err != nil {
		log.L.WithError(err).Debug("cgroup attach not warmed")
		close(w.done)
		return w
	}
	go w.run(procs)
	return w
}

func (w *AttachWarmer) run(procs string) {
	defer close(w.done)
	tick := time.NewTicker(warmEvery)
	defer tick.Stop()
	for {
		if err := writeSelf(procs); err != nil {
			log.L.WithError(err).Debug("cgroup attach not warmed")
			return
		}
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
	}
}

// Stop ends the warming, once its current write is done; the attach it was for must follow
// within a grace period. Stop may be called more than once.
func (w *AttachWarmer) Stop() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
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
		data, err := os.ReadFile("/proc/self/cgroup")
		if err != nil {
			return "", err
		}
		own, err := unifiedPath(string(data))
		if err != nil {
			return "", err
		}
		return filepath.Join("/sys/fs/cgroup", own, "cgroup.procs"), nil
	}
	dir, err := cgroups.GetOwnCgroupPath("freezer")
	if err != nil {
		return "", fmt.Errorf("own freezer cgroup: %w", err)
	}
	return filepath.Join(dir, "cgroup.procs"), nil
}

// unifiedPath is the cgroup v2 path in the contents of /proc/PID/cgroup (its "0::" line).
func unifiedPath(procCgroup string) (string, error) {
	for _, line := range strings.Split(procCgroup, "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok && strings.HasPrefix(p, "/") {
			return p, nil
		}
	}
	return "", fmt.Errorf("no cgroup v2 path in /proc/self/cgroup")
}
