package capture

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/snapshots"
)

// Write writes what Walk found into the capture's snapshot; the upper's writers must still be
// still.
func (c *Capture) Write() error {
	if err := newWriter(c.upper, c.to).apply(c.ops); err != nil {
		return fmt.Errorf("capturing %s into %s: %w", c.key, c.tmp, err)
	}
	// The filesystem's use once the capture is written, the writers still frozen: what the next
	// capture's Growth starts from. Taken after the copy, not before the walk, so that the
	// capture's own files (and whatever else wrote meanwhile: CRIU's images, other uppers) do not
	// count as the task's at the next checkpoint, where they would trip the switch rule's cheap
	// check and send it to the estimate's walk.
	use, err := statUse(c.upper)
	if err != nil {
		return fmt.Errorf("capturing %s: %w", c.key, err)
	}
	c.use = use
	return nil
}

// Commit commits the written capture as its layer with labels, and returns the record the next
// capture of the same upper compares with. On failure the capture is aborted.
func (c *Capture) Commit(ctx context.Context, sn snapshots.Snapshotter, labels map[string]string) (*Record, error) {
	if err := sn.Commit(ctx, c.name, c.tmp, snapshots.WithLabels(labels)); err != nil {
		_ = c.Abort(ctx, sn)
		return nil, fmt.Errorf("capturing %s: commit %s as %s: %w", c.key, c.tmp, c.name, err)
	}
	c.committed = true
	return &Record{Key: c.key, Parent: c.parent, Upper: c.upper, Layer: c.name, Labels: labels, Size: c.stats.Size, use: c.use, entries: c.entries}, nil
}

// Abort removes the capture's snapshot, or once committed its layer (a checkpoint that failed
// after the commit). What it cannot remove (the snapshotter is gone) stays under the caller's
// lease, and goes with it; the error says what stayed. Aborting again does nothing.
func (c *Capture) Abort(ctx context.Context, sn snapshots.Snapshotter) error {
	if c.removed {
		return nil
	}
	name := c.tmp
	if c.committed {
		name = c.name
	}
	if err := sn.Remove(context.WithoutCancel(ctx), name); err != nil {
		return fmt.Errorf("capturing %s: remove %s: %w", c.key, name, err)
	}
	c.removed = true
	return nil
}
