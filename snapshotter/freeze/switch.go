package freeze

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cklite/cklite/pkg/fault"
)

// Switch replaces the rootfs snapshot of a container by a fresh one on another parent (a
// checkpoint's frozen layer: a rollback, a fork, a restore) so that a crash at any moment leaves
// the container referring to a snapshot that exists (issue 16 item 1). Removing the key and
// preparing it again on the new parent, the obvious way, loses the container to a crash between
// the two. A switch makes three steps, each a single transaction of containerd's:
//
//  1. Prepare a fresh key on the new parent, under a lease, with the old key's labels;
//  2. Update the container record's SnapshotKey to the fresh key (containerd's fieldpath
//     "snapshotkey"): the atomic step;
//  3. Remove the old key (Switched.Finish, which the caller may run once it has answered: a
//     rollback's restore does not wait for it).
//
// A crash before 2 leaves the container on its old key and a fresh key that only the lease holds:
// containerd's collector frees it when the lease expires. A crash between 2 and 3 leaves the
// container on the fresh key and the old one unreferenced: the collector frees it too, and the
// next switch removes it at once (LabelReplaces names it).
//
// The fresh key is "<container id>-<8 random hex digits>": unique without asking containerd,
// and the same length after any number of switches. The container's key is therefore not always
// its id: whatever deletes a container reads the key from its record (nerdctl rm, the CRI's
// RemoveContainer, ctr's --snapshot-cleanup), as containerd's task create does; the CRI's cache
// of snapshot sizes, keyed by container id, reports 0 bytes for a switched writable layer.

// LabelReplaces, on a rootfs snapshot a switch prepared, is the key it replaced.
const LabelReplaces = "cklite.io/rootfs.replaces"

// Containers is what a switch asks of containerd's container store (containers.Store).
type Containers interface {
	Get(ctx context.Context, id string) (containers.Container, error)
	Update(ctx context.Context, c containers.Container, fieldpaths ...string) (containers.Container, error)
}

// Switched is a container's rootfs snapshot after a switch.
type Switched struct {
	Key    string
	Mounts []mount.Mount

	sn       snapshots.Snapshotter
	replaced []string // the keys Finish removes: the container's former key, and the one it replaced
	done     func()   // ends the switch's lease
}

// Finish ends a switch: it removes the keys the container's former key replaced and that key
// itself, and ends the lease that held the fresh key until the container referred to it. A
// failure is only logged: nothing refers to them, the collector frees them (once the lease
// expires), and the next switch removes them (LabelReplaces). Nothing waits on it but the
// collector: a rollback runs it after its answer.
func (sw Switched) Finish(ctx context.Context) {
	for _, old := range sw.replaced {
		removeReplaced(ctx, sw.sn, sw.Key, old)
	}
	if sw.done != nil {
		sw.done()
	}
}

// Switch moves container id's rootfs to a fresh active snapshot of sn (the container's
// snapshotter) on the committed snapshot parent, with the labels of its current one; the
// container's labels in labels are set in the same update of its record (a rollback's lineage:
// one transaction of containerd's, not two). The current key is removed by the returned
// Switched's Finish. lm makes the lease that holds the fresh key until the container refers to
// it; it may be nil when ctx carries a lease. The caller keeps the container's rootfs unmounted
// and its task stopped meanwhile; what was written to the old key since parent is discarded.
func Switch(ctx context.Context, sn snapshots.Snapshotter, cs Containers, lm leases.Manager, id, parent string, labels map[string]string) (_ Switched, retErr error) {
	// The lease is a transaction of containerd's of its own (a write and its sync): it is made
	// while the container's key is read, which it does not depend on.
	lease := make(chan leaseMade, 1)
	go func() {
		var l leaseMade
		l.ctx, l.done, l.err = leased(ctx, lm)
		lease <- l
	}()
	old, snLabels, replaced, err := current(ctx, sn, cs, id)
	l := <-lease
	if err == nil && l.err != nil {
		err = fmt.Errorf("switch the rootfs of container %s: %w", id, l.err)
	}
	if err != nil {
		if l.err == nil {
			l.done()
		}
		return Switched{}, err
	}
	ctx, done := l.ctx, l.done
	defer func() {
		if retErr != nil {
			done()
		}
	}()
	sw, err := prepareFresh(ctx, sn, id, parent, snLabels)
	if err != nil {
		return Switched{}, err
	}
	fault.Point(fault.SwitchPrepared)
	if err := repoint(ctx, sn, cs, id, old, sw.Key, labels); err != nil {
		return Switched{}, err
	}
	fault.Point(fault.SwitchUpdated)
	sw.sn, sw.replaced, sw.done = sn, replaced, done
	return sw, nil
}

// leaseMade is leased's answer.
type leaseMade struct {
	ctx  context.Context
	done func()
	err  error
}

// current reads container id's rootfs key old, the labels its fresh key gets (old's, with
// LabelReplaces naming old) and the keys the switch's Finish removes.
func current(ctx context.Context, sn snapshots.Snapshotter, cs Containers, id string) (old string, snLabels map[string]string, replaced []string, _ error) {
	ctr, err := cs.Get(ctx, id)
	if err != nil {
		return "", nil, nil, fmt.Errorf("switch the rootfs of container %s: %w", id, err)
	}
	old = ctr.SnapshotKey
	if old == "" {
		return "", nil, nil, fmt.Errorf("switch the rootfs of container %s: it has no rootfs snapshot: %w", id, errdefs.ErrFailedPrecondition)
	}
	info, err := sn.Stat(ctx, old)
	if err != nil && !errdefs.IsNotFound(err) {
		return "", nil, nil, fmt.Errorf("switch the rootfs of container %s: %w", id, err)
	}
	// A key already lost (a crash before switches existed) gets a new one all the same.
	replaced = []string{old}
	if prev := info.Labels[LabelReplaces]; prev != "" {
		replaced = []string{prev, old} // left by a switch whose Finish did not run
	}
	snLabels = maps.Clone(info.Labels)
	if snLabels == nil {
		snLabels = map[string]string{}
	}
	snLabels[LabelReplaces] = old
	return old, snLabels, replaced, nil
}

// repoint points container id's record from the snapshot key old to key, which exists, and sets
// its labels in labels: containerd's Update of the field paths "snapshotkey" and "labels.<name>",
// one transaction. A failed update is checked
// by reading the record again (a containerd that died after its transaction committed has
// moved it); if the record still names old, key is removed (its lease would free it), and if it
// cannot be read, key is left to its lease: the record may name it.
func repoint(ctx context.Context, sn snapshots.Snapshotter, cs Containers, id, old, key string, labels map[string]string) error {
	paths := []string{"snapshotkey"}
	for name := range labels {
		paths = append(paths, "labels."+name)
	}
	_, err := cs.Update(ctx, containers.Container{ID: id, SnapshotKey: key, Labels: labels}, paths...)
	if err == nil {
		return nil
	}
	c, gerr := cs.Get(ctx, id)
	switch {
	case gerr == nil && c.SnapshotKey == key:
		return nil
	case gerr == nil && c.SnapshotKey == old:
		removeQuietly(ctx, sn, key, "the fresh rootfs snapshot of a failed switch")
	}
	return fmt.Errorf("switch the rootfs of container %s to %s: update the container: %w", id, key, err)
}

// removeReplaced removes old, the key that current replaced, if it is still there. A failure is
// only logged: nothing refers to old, the collector frees it, and the next switch tries again.
func removeReplaced(ctx context.Context, sn snapshots.Snapshotter, current, old string) {
	if old == "" || old == current {
		return
	}
	err := sn.Remove(ctx, old)
	if err != nil && !errdefs.IsNotFound(err) {
		log.G(ctx).WithError(err).WithFields(log.Fields{"key": old, "replaced by": current}).Warn("remove a replaced rootfs snapshot")
	}
}

// prepareFresh prepares a key of container id no snapshot has, on parent.
func prepareFresh(ctx context.Context, sn snapshots.Snapshotter, id, parent string, labels map[string]string) (Switched, error) {
	for range 3 { // a second collision of 32 random bits would be a broken random source
		key, err := freshKey(id)
		if err != nil {
			return Switched{}, err
		}
		mounts, err := sn.Prepare(ctx, key, parent, snapshots.WithLabels(labels))
		if errdefs.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return Switched{}, fmt.Errorf("switch the rootfs of container %s: prepare %s on %s: %w", id, key, parent, err)
		}
		return Switched{Key: key, Mounts: mounts}, nil
	}
	return Switched{}, fmt.Errorf("switch the rootfs of container %s: no fresh key: %w", id, errdefs.ErrAlreadyExists)
}

func freshKey(id string) (string, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random snapshot key: %w", err)
	}
	return id + "-" + hex.EncodeToString(b), nil
}
