package checkpoint

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
)

// Labels of a checkpoint's lease. LabelID also marks the frozen snapshot, so the checkpoint a
// container's rootfs is stacked on can be found from the snapshot's parent.
const (
	LabelID          = "cklite.io/checkpoint"
	LabelContainer   = "cklite.io/checkpoint.container"
	LabelParent      = "cklite.io/checkpoint.parent"
	LabelContents    = "cklite.io/checkpoint.contents"
	LabelSnapshotter = "cklite.io/checkpoint.snapshotter"
	LabelFrozen      = "cklite.io/checkpoint.frozen"
	LabelCreated     = "cklite.io/checkpoint.created"
	LabelMemoryBytes = "cklite.io/checkpoint.memory-bytes"
	LabelHost        = "cklite.io/checkpoint.host"
	LabelVersion     = "cklite.io/checkpoint.version"
	// LabelImagePath is where the image directory was written, when it outlives the checkpoint
	// call (nerdctl's checkpoint directory, ctr's --image-path); not set for the daemon's
	// temporary directory, whose contents live on in a checkpoint image.
	LabelImagePath = "cklite.io/checkpoint.image-path"
	// labelExpire is containerd's: its garbage collector deletes the lease after this time.
	labelExpire = "containerd.io/gc.expire"
)

// LeaseID is the containerd lease of checkpoint id.
func LeaseID(id string) string { return "cklite.checkpoint." + id }

// Record is a checkpoint as its lease describes it.
type Record struct {
	Meta
	ImagePath string // see LabelImagePath
}

// labels is the lease's label set for r.
func (r Record) labels() map[string]string {
	l := map[string]string{
		LabelID:          r.ID,
		LabelContainer:   r.Container,
		LabelContents:    string(r.Contents),
		LabelCreated:     r.Created.UTC().Format(time.RFC3339Nano),
		LabelMemoryBytes: strconv.FormatInt(r.MemoryBytes, 10),
	}
	for k, v := range map[string]string{
		LabelParent: r.Parent, LabelSnapshotter: r.Snapshotter, LabelFrozen: r.Frozen, LabelImagePath: r.ImagePath,
		LabelHost: r.Host, LabelVersion: r.Version, LabelName: r.Name,
	} {
		if v != "" {
			l[k] = v
		}
	}
	for k, v := range r.Labels {
		l[LabelUserPrefix+k] = v
	}
	if !r.Expires.IsZero() {
		l[labelExpire] = r.Expires.UTC().Format(time.RFC3339)
	}
	return l
}

// FromLease reads a checkpoint's record from its lease; namespace is the lease's.
func FromLease(namespace string, l leases.Lease) (Record, error) {
	id := l.Labels[LabelID]
	if id == "" || l.ID != LeaseID(id) {
		return Record{}, fmt.Errorf("lease %s is not a cklite checkpoint: %w", l.ID, errdefs.ErrInvalidArgument)
	}
	r := Record{Meta: Meta{
		Format:      FormatVersion,
		ID:          id,
		Namespace:   namespace,
		Container:   l.Labels[LabelContainer],
		Contents:    Contents(l.Labels[LabelContents]),
		Snapshotter: l.Labels[LabelSnapshotter],
		Frozen:      l.Labels[LabelFrozen],
		Parent:      l.Labels[LabelParent],
		Host:        l.Labels[LabelHost],
		Version:     l.Labels[LabelVersion],
		Name:        l.Labels[LabelName],
		Labels:      userLabels(l.Labels),
	}, ImagePath: l.Labels[LabelImagePath]}
	var err error
	if r.Created, err = time.Parse(time.RFC3339Nano, l.Labels[LabelCreated]); err != nil {
		return Record{}, fmt.Errorf("lease %s: created: %w", l.ID, err)
	}
	if v := l.Labels[labelExpire]; v != "" {
		if r.Expires, err = time.Parse(time.RFC3339, v); err != nil {
			return Record{}, fmt.Errorf("lease %s: expiry: %w", l.ID, err)
		}
	}
	if v := l.Labels[LabelMemoryBytes]; v != "" {
		if r.MemoryBytes, err = strconv.ParseInt(v, 10, 64); err != nil {
			return Record{}, fmt.Errorf("lease %s: memory bytes: %w", l.ID, err)
		}
	}
	return r, nil
}

// Hold creates r's lease, holding its frozen snapshot (if any). The caller's context must carry
// r's namespace.
func Hold(ctx context.Context, lm leases.Manager, r Record) (leases.Lease, error) {
	l, err := lm.Create(ctx, leases.WithID(LeaseID(r.ID)), leases.WithLabels(r.labels()))
	if err != nil {
		return leases.Lease{}, fmt.Errorf("create lease of checkpoint %s: %w", r.ID, err)
	}
	if r.Frozen != "" {
		res := leases.Resource{ID: r.Frozen, Type: "snapshots/" + r.Snapshotter}
		if err := lm.AddResource(ctx, l, res); err != nil {
			_ = lm.Delete(ctx, l)
			return leases.Lease{}, fmt.Errorf("hold frozen layer %s of checkpoint %s: %w", r.Frozen, r.ID, err)
		}
	}
	return l, nil
}

// List returns the checkpoints of the namespace in ctx, oldest first.
func List(ctx context.Context, lm leases.Manager, namespace string) ([]Record, error) {
	return list(ctx, lm, namespace, fmt.Sprintf("labels.%q", LabelID))
}

// list returns the checkpoints whose leases match any of filters, oldest first.
func list(ctx context.Context, lm leases.Manager, namespace string, filters ...string) ([]Record, error) {
	ls, err := lm.List(ctx, filters...)
	if err != nil {
		return nil, fmt.Errorf("list checkpoint leases: %w", err)
	}
	var out []Record
	for _, l := range ls {
		r, err := FromLease(namespace, l)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Record) int { return a.Created.Compare(b.Created) })
	return out, nil
}
