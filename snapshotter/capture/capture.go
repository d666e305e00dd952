package capture

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/snapshots"
)

// Commit writes the plan into a snapshot prepared on its base and commits it as the layer name
// with labels, and returns the record the next capture of the same upper compares with. Call it
// under a lease (containerd's collector must not take the temporary snapshot or the layer); on
// failure the temporary snapshot is removed and no layer exists.
func (p *Plan) Commit(ctx context.Context, sn snapshots.Snapshotter, name string, labels map[string]string) (_ *Record, retErr error) {
	tmp := "cklite/capturing/" + name
	ms, err := sn.Prepare(ctx, tmp, p.base)
	if err != nil {
		return nil, fmt.Errorf("capturing %s: prepare %s on %q: %w", p.key, tmp, p.base, err)
	}
	defer func() {
		if retErr != nil {
			_ = sn.Remove(context.WithoutCancel(ctx), tmp)
		}
	}()
	to, err := upperOf(tmp, ms)
	if err != nil {
		return nil, err
	}
	if err := newWriter(p.upper, to).apply(p.ops); err != nil {
		return nil, fmt.Errorf("capturing %s into %s: %w", p.key, tmp, err)
	}
	if err := sn.Commit(ctx, name, tmp, snapshots.WithLabels(labels)); err != nil {
		return nil, fmt.Errorf("capturing %s: commit %s as %s: %w", p.key, tmp, name, err)
	}
	return &Record{Upper: p.upper, Layer: name, entries: p.entries}, nil
}
