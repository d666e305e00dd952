package freeze

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

// Copy freezes a copy of the active snapshot key as the committed layer name, stacked on key's
// parent, while key stays as it is, mounted and written to: the filesystem-only checkpoint of a
// running container, whose overlay mount cannot switch to a new upper. It costs a copy of key's
// upper directory (what changed since key's parent), not Freeze's O(1); the caller keeps the
// writers still while it runs (a frozen cgroup). Only overlay snapshotters have an upper to copy.
func Copy(ctx context.Context, sn snapshots.Snapshotter, lm leases.Manager, key, name string, labels map[string]string) (retErr error) {
	info, err := sn.Stat(ctx, key)
	if err != nil {
		return fmt.Errorf("copying %s: %w", key, err)
	}
	if info.Kind != snapshots.KindActive {
		return fmt.Errorf("copying %s: it is a %s snapshot, only an active one has an upper to copy: %w", key, info.Kind, errdefs.ErrFailedPrecondition)
	}
	from, err := mountsOf(ctx, sn, key)
	if err != nil {
		return err
	}
	ctx, done, err := leased(ctx, lm)
	if err != nil {
		return fmt.Errorf("copying %s: %w", key, err)
	}
	defer done()
	tmp := "cklite/copying/" + name
	ms, err := sn.Prepare(ctx, tmp, info.Parent)
	if err != nil {
		return fmt.Errorf("copying %s: prepare %s on %s: %w", key, tmp, info.Parent, err)
	}
	defer func() {
		if retErr != nil {
			_ = sn.Remove(context.WithoutCancel(ctx), tmp)
		}
	}()
	to, err := upperOf(tmp, ms)
	if err != nil {
		return err
	}
	// cp -a keeps what overlayfs stores in an upper: whiteouts (0/0 character devices), opaque
	// directories (trusted.overlay.* xattrs, copied as root), owners, modes and times; reflinks
	// make the copy O(1) per file where the filesystem has them.
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", from+"/.", to+"/").CombinedOutput(); err != nil {
		return fmt.Errorf("copying the upper of %s (%s): %w: %s", key, from, err, strings.TrimSpace(string(out)))
	}
	if err := sn.Commit(ctx, name, tmp, snapshots.WithLabels(labels)); err != nil {
		return fmt.Errorf("copying %s: commit the copy as %s: %w", key, name, err)
	}
	return nil
}

func mountsOf(ctx context.Context, sn snapshots.Snapshotter, key string) (string, error) {
	ms, err := sn.Mounts(ctx, key)
	if err != nil {
		return "", fmt.Errorf("copying %s: %w", key, err)
	}
	return upperOf(key, ms)
}

// upperOf is the directory an active snapshot's mounts write to: the overlay's upperdir, or the
// bind-mounted directory of a snapshot without parent.
func upperOf(key string, ms []mount.Mount) (string, error) {
	if len(ms) == 1 {
		m := ms[0]
		switch m.Type {
		case "overlay":
			for _, o := range m.Options {
				if dir, ok := strings.CutPrefix(o, "upperdir="); ok {
					return dir, nil
				}
			}
		case "bind":
			return m.Source, nil
		}
	}
	return "", fmt.Errorf("snapshot %s is not an overlay with an upper directory (mounts %v): a filesystem-only checkpoint of a running task needs one: %w", key, ms, errdefs.ErrNotImplemented)
}
