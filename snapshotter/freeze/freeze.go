// Package freeze is the client side of cklite's checkpoint primitive: it turns the active snapshot
// of a container into an immutable layer and stacks a fresh, empty active snapshot with the same
// key on it.
//
// The protocol is two calls of containerd's own snapshot API, made through containerd (its
// metadata must know the frozen layer, or its garbage collector deletes it from the backend):
//
//	Commit(name, key)  the upper directory of key becomes the committed layer name: with the cklite
//	                   snapshotter an O(1) metadata change, no file is walked or copied;
//	Prepare(key, name) key exists again, active, empty, with its old labels, on top of name.
//
// The container keeps referring to key, so it needs no update; its next mount of key shows the
// same files, with name as the top lower layer. Both calls run under a lease: between them
// nothing else refers to name. The cklite snapshotter refuses the Commit while key's upper is
// mounted (a running task would keep writing into the frozen layer): stop the task, or let the
// shim checkpoint it, which unmounts around the freeze.
//
// Freeze leaves the key absent between its two calls: a crash there loses the container's
// rootfs. Rootfs (rootfs.go) is the crash-safe freeze of a container's rootfs that checkpoints
// use: the container's record names a snapshot that exists and shows its files at every moment
// (the snapshotter lends the upper to the layer being committed, see lend.go in package
// snapshotter).
//
// Switch (switch.go) is the other direction: it moves a container to a fresh active snapshot on
// another committed layer (a rollback, a restore, a fork), crash-safe: the container's record is
// updated in one step from a key that exists to another that exists.
package freeze

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

// Labels of the lending protocol between Rootfs and the cklite snapshotter (its lend.go); they
// reach the backend because they start with containerd.io/snapshot/.
const (
	// LabelUpperOf, on a Prepare, asks that the new active snapshot borrow the upper directory
	// (the label's value) of an active snapshot on the same parent.
	LabelUpperOf = "containerd.io/snapshot/cklite.io/upper-of"
	// LabelHandOver, set by an Update on a lender, gives its upper directory to the borrower.
	LabelHandOver = "containerd.io/snapshot/cklite.io/hand-over"
)

// leaseExpiry bounds how long the layers of a freeze whose caller died stay protected.
const leaseExpiry = 10 * time.Minute

// Freeze commits the active snapshot key of sn as name and prepares key again on name. labels go
// on name: e.g. a containerd.io/gc.root label, or the gc.ref labels of a checkpoint record, keep
// it once the container moves on. lm makes the lease that protects the freeze; it may be nil when
// ctx already carries a lease.
func Freeze(ctx context.Context, sn snapshots.Snapshotter, lm leases.Manager, key, name string, labels map[string]string) error {
	info, err := sn.Stat(ctx, key)
	if err != nil {
		return fmt.Errorf("freezing %s: %w", key, err)
	}
	if info.Kind != snapshots.KindActive {
		return fmt.Errorf("freezing %s: it is a %s snapshot, only an active one can be frozen: %w", key, info.Kind, errdefs.ErrFailedPrecondition)
	}
	// Deleting the lease only drops its protection: by then the container refers to key, and
	// key to name, or the caller's labels keep name.
	ctx, done, err := leased(ctx, lm)
	if err != nil {
		return fmt.Errorf("freezing %s: %w", key, err)
	}
	defer done()
	if err := sn.Commit(ctx, name, key, snapshots.WithLabels(labels)); err != nil {
		return fmt.Errorf("freezing %s as %s: %w", key, name, err)
	}
	if _, err := sn.Prepare(ctx, key, name, snapshots.WithLabels(info.Labels)); err != nil {
		// The files are safe in name; only the container's snapshot is missing until a Prepare
		// of key on name succeeds.
		return fmt.Errorf("froze %s as %s, but preparing %s again on it failed (retry: prepare %s on %s): %w", key, name, key, key, name, err)
	}
	return nil
}

// leased returns ctx with a lease for the snapshots a freeze creates: the caller's, or a new one
// from lm that done deletes.
func leased(ctx context.Context, lm leases.Manager) (context.Context, func(), error) {
	if _, ok := leases.FromContext(ctx); ok {
		return ctx, func() {}, nil
	}
	if lm == nil {
		return nil, nil, fmt.Errorf("no lease in the context and no lease manager: %w", errdefs.ErrInvalidArgument)
	}
	lease, err := lm.Create(ctx, leases.WithRandomID(), leases.WithExpiration(leaseExpiry))
	if err != nil {
		return nil, nil, err
	}
	done := func() { _ = lm.Delete(context.WithoutCancel(ctx), lease) }
	return leases.WithLease(ctx, lease.ID), done, nil
}
