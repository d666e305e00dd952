package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/runtime"
)

// A shim can be killed at any moment, a checkpoint's included. What it leaves behind must not
// keep the container from starting again (issue 16 items 2, 3 and 7): CRIU processes still at
// work on the container, its processes frozen by the checkpoint, libcontainer's state under the
// runc root ("container with given ID already exists"), its cgroups, and the cgroup mounts CRIU
// keeps in its work directory in the bundle (criu-work/.criu.cgyard.*), which keep containerd
// from removing the bundle ("mkdir ...: file exists"). containerd's `shim delete` after a dead
// shim (manager.Stop) removes all of it; a shim creating a container whose leftovers are still
// there (a delete that failed) removes them first.

// recoverContainer removes what a killed shim left of container id with bundle bundle and
// libcontainer root root, and returns the init's pid (0 if nothing was left).
func recoverContainer(ctx context.Context, bundle, root, id string) (int, error) {
	// CRIU runs with the shim's working directory, the bundle, and logs into criu-work.
	pid, err := runtime.Recover(root, id, []string{bundle})
	work := criuWorkDir(bundle)
	if _, serr := os.Stat(work); serr == nil {
		if uerr := mount.UnmountRecursive(work, unix.MNT_DETACH); uerr != nil {
			err = errors.Join(err, fmt.Errorf("unmount CRIU's mounts in %s: %w", work, uerr))
		} else if rerr := os.RemoveAll(work); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove %s: %w", work, rerr))
		}
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", id).Warn("clean up after a killed shim")
	}
	return pid, err
}

// criuWorkDir is the bundle's CRIU work directory (checkpoints and rollbacks without a client's).
func criuWorkDir(bundle string) string { return filepath.Join(bundle, "criu-work") }

// hasLeftovers reports whether a killed shim may have left something of c behind.
func (c *container) hasLeftovers() bool {
	for _, p := range []string{filepath.Join(c.stateRoot, c.id), criuWorkDir(c.bundle)} {
		if _, err := os.Lstat(p); err == nil {
			return true
		}
	}
	return false
}
