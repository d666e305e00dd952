package checkpoint

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

// StatFunc asks a snapshotter (named as Meta.Snapshotter) about snapshot name.
type StatFunc func(ctx context.Context, snapshotter, name string) (snapshots.Info, error)

// KeepAncestry gives each record whose parent checkpoint is gone (removed, or expired) the
// nearest checkpoint among records that it still descends from, so that removing a middle node
// leaves its children under its parent rather than as separate roots. Leases cannot be
// relabelled, and the ancestry is still written in the layers: a removed checkpoint's frozen
// layer stays as long as a layer is stacked on it, labelled LabelID, so walking down the frozen
// layers from the record's own finds the nearest one a listed checkpoint names. A record with no
// such ancestor keeps its Parent (NewTree then draws it as an orphan root). Records are changed
// in place; the error is the first Stat that failed for another reason than a missing layer.
func KeepAncestry(ctx context.Context, records []Record, stat StatFunc) error {
	listed := make(map[string]bool, len(records))
	for _, r := range records {
		listed[r.ID] = true
	}
	for i := range records {
		r := &records[i]
		if r.Parent == "" || listed[r.Parent] || r.Frozen == "" {
			continue
		}
		parent, err := nearestListed(ctx, *r, listed, stat)
		if err != nil {
			return err
		}
		if parent != "" {
			r.Parent = parent
		}
	}
	return nil
}

// nearestListed walks down from r's frozen layer to the first layer that a listed checkpoint
// names, and returns that checkpoint; "" when the walk reaches the image's layers first.
func nearestListed(ctx context.Context, r Record, listed map[string]bool, stat StatFunc) (string, error) {
	name := r.Frozen
	// A chain is finite, but a snapshotter that answers in a loop must not hang the walk.
	for range 100_000 {
		info, err := stat(ctx, r.Snapshotter, name)
		if errdefs.IsNotFound(err) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("ancestry of checkpoint %s: %w", r.ID, err)
		}
		if id := info.Labels[LabelID]; name != r.Frozen && listed[id] {
			return id, nil
		}
		if info.Parent == "" {
			return "", nil
		}
		name = info.Parent
	}
	return "", nil
}
