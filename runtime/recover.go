package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"
)

// Recover removes what a shim killed at any moment (in the middle of a checkpoint included) left
// of container id under the libcontainer root: the CRIU processes still working on it (those
// ptrace-holding its processes, or with files below dirs or its state), a cgroup left frozen by
// the checkpoint, its processes, its cgroups and its state, so that a container of that id can
// be created again. It returns the init's pid, or 0 when nothing was left.
func Recover(root, id string, dirs []string) (int, error) {
	stateDir := filepath.Join(root, id)
	lc, err := libcontainer.Load(root, id)
	if errors.Is(err, libcontainer.ErrNotExist) {
		_, err := EndCRIUOrphans(nil, append(dirs, stateDir))
		return 0, err
	}
	if err != nil {
		// A state libcontainer cannot read is no container: nothing runs under it.
		log.L.WithError(err).WithField("state", stateDir).Warn("removing unreadable container state")
		return 0, removeState(stateDir)
	}
	pids, _ := lc.Processes()
	killed, err := EndCRIUOrphans(pids, append(dirs, stateDir))
	if err != nil {
		return 0, err
	}
	if len(killed) > 0 {
		log.L.WithField("pids", killed).Warn("ended CRIU processes a killed shim had left running")
	}
	c := &Container{lc: lc, root: root}
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
