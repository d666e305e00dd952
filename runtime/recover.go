package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"
)

// Recover removes what a shim killed at any moment (in the middle of a checkpoint included) left
// of container id under the libcontainer root: the CRIU processes still working on it (those
// ptrace-holding its processes, or with files below dirs or its state), a cgroup left frozen by
// the checkpoint, its processes, its cgroups and its state, so that a container of that id can
// be created again. It returns the init's pid, or 0 when nothing was left.
//
// Without a readable state (a shim killed in a restore, before libcontainer wrote it) the
// cgroup is found through cg, the container's configuration's, if given.
func Recover(root, id string, dirs []string, cg *cgroups.Cgroup) (int, error) {
	stateDir := filepath.Join(root, id)
	c, err := Load(root, id)
	if err != nil {
		if !errors.Is(err, libcontainer.ErrNotExist) {
			log.L.WithError(err).WithField("state", stateDir).Warn("removing unreadable container state")
		}
		_, oerr := EndCRIUOrphans(nil, append(dirs, stateDir))
		return 0, errors.Join(oerr, removeCgroup(cg), removeState(stateDir))
	}
	pids, _ := c.lc.Processes()
	killed, err := EndCRIUOrphans(pids, append(dirs, stateDir))
	if err != nil {
		return 0, err
	}
	if len(killed) > 0 {
		log.L.WithField("pids", killed).Warn("ended CRIU processes a killed shim had left running")
	}
	pid := c.InitPid()
	// A checkpoint freezes the cgroup around the dump: killed then, it leaves the processes
	// frozen, where SIGKILL does not reach them.
	if c.Paused() {
		if err := c.Resume(); err != nil {
			return pid, fmt.Errorf("thaw the cgroup of container %s: %w", id, err)
		}
	}
	if err := c.Destroy(); err != nil {
		return pid, err
	}
	return pid, nil
}

// removeState removes a container's libcontainer state directory, with the rootfs bind mount a
// restore keeps in it.
func removeState(dir string) error {
	if err := unix.Unmount(filepath.Join(dir, "criu-root"), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount criu-root of %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove container state %s: %w", dir, err)
	}
	return nil
}

// removeCgroup thaws cg, kills what runs in it and removes it; a cgroup that does not exist is
// left alone.
func removeCgroup(cg *cgroups.Cgroup) error {
	if cg == nil {
		return nil
	}
	m, err := manager.New(cg)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", cg.Path, err)
	}
	if !m.Exists() {
		return nil
	}
	_ = m.Freeze(cgroups.Thawed)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		pids, err := m.GetAllPids()
		if err != nil || len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	if err := m.Destroy(); err != nil {
		return fmt.Errorf("remove cgroup %s: %w", cg.Path, err)
	}
	return nil
}
