package freeze

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cklite/cklite/pkg/fault"
)

// Rootfs freezes a container's rootfs in place, crash-safe: its upper becomes the committed layer
// name in O(1), and the container goes on from a fresh, empty upper on it under the same key.
// Freeze's Commit+Prepare of the same key leaves the container without its key between the two
// (containerd's Commit removes the active key in the transaction that commits it); here the
// container's record names a snapshot that exists and shows its files at every moment, and the
// snapshotter lends the upper directory instead of copying it (the cklite snapshotter's lend.go):
//
//  1. lend: prepare "cklite/freezing/<name>" on the key's parent, borrowing the key's upper
//     (LabelUpperOf): both show the same files, one directory;
//  2. commit the borrower as name: the container still refers to its key, intact;
//  3. move: prepare a fresh key on name and point the container's record at it (one transaction);
//  4. hand over: the key's directory becomes name's (LabelHandOver: one rename), then remove the
//     key;
//  5. rename: prepare the key again on name and point the record back at it, then remove the fresh
//     key. Clients that read the container's key before the checkpoint (containerd's Go client
//     diffs it afterwards) find it, with an empty upper.
//
// A crash before 3 leaves the container on its key and the borrower or name under the lease
// (containerd's collector frees them: a borrower takes only its link along); from 3 on, on a key
// on name that shows the same files; before 4 is done, containerd's collector hands the directory
// over when it removes the old key. Each step has a fault point. The caller keeps the rootfs
// unmounted and the task stopped throughout (the snapshotter refuses to lend or hand over a
// mounted upper). lm makes the lease; it may be nil when ctx carries one.
//
// Rootfs returns the key the container's record names when it returns, also on failure (the
// caller mounts that one); name is committed only if Rootfs succeeded (an error after the commit
// removes it, or leaves it to the lease, or in the chain of the fresh key the container is on).
func Rootfs(ctx context.Context, sn snapshots.Snapshotter, cs Containers, lm leases.Manager, id, name string, labels map[string]string) (string, error) {
	var (
		key    string
		info   snapshots.Info
		mounts []mount.Mount
	)
	err := step(ctx, func() error {
		ctr, err := cs.Get(ctx, id)
		if err != nil {
			return err
		}
		key = ctr.SnapshotKey
		if info, err = sn.Stat(ctx, key); err != nil {
			return err
		}
		mounts, err = sn.Mounts(ctx, key)
		return err
	})
	if err != nil {
		return key, fmt.Errorf("freeze the rootfs of container %s: %w", id, err)
	}
	if info.Kind != snapshots.KindActive {
		return key, fmt.Errorf("freeze the rootfs of container %s: %s is a %s snapshot: %w", id, key, info.Kind, errdefs.ErrFailedPrecondition)
	}
	removeReplaced(ctx, sn, key, info.Labels[LabelReplaces])
	ctx, done, err := leased(ctx, lm)
	if err != nil {
		return key, fmt.Errorf("freeze the rootfs of container %s: %w", id, err)
	}
	defer done()
	upper, err := UpperDir(key, mounts)
	if err == nil {
		err = lendAndCommit(ctx, sn, key, info.Parent, upper, name, labels)
	}
	if errdefs.IsNotImplemented(err) {
		// Not an overlay, or a snapshotter that does not lend (containerd's overlayfs): the
		// freeze of old, with its moment without the key.
		log.G(ctx).WithError(err).WithField("key", key).Warn("the snapshotter cannot lend the upper: freezing it by Commit and Prepare of the key")
		return key, Freeze(ctx, sn, nil, key, name, labels)
	}
	if err != nil {
		return key, fmt.Errorf("freeze the rootfs of container %s: %w", id, err)
	}
	fr := &frozenRootfs{sn: sn, cs: cs, id: id, key: key, name: name, labels: info.Labels}
	if err := fr.move(ctx); err != nil {
		return fr.on, err
	}
	return fr.on, fr.rename(ctx)
}

// lendAndCommit makes name, a committed layer on parent whose directory is key's upper (steps 1
// and 2 of Rootfs).
func lendAndCommit(ctx context.Context, sn snapshots.Snapshotter, key, parent, upper, name string, labels map[string]string) error {
	borrower := "cklite/freezing/" + name
	var mounts []mount.Mount
	err := step(ctx, retried(func() (err error) {
		mounts, err = sn.Prepare(ctx, borrower, parent, snapshots.WithLabels(map[string]string{LabelUpperOf: upper}))
		return err
	}, errdefs.IsAlreadyExists))
	if err == nil && mounts == nil { // made by a try whose answer was lost
		err = step(ctx, func() (err error) {
			mounts, err = sn.Mounts(ctx, borrower)
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("lend the upper of %s: %w", key, err)
	}
	if !borrows(borrower, mounts, upper) {
		removeQuietly(ctx, sn, borrower, "the snapshot that did not borrow")
		return fmt.Errorf("%s did not borrow the upper of %s: %w", borrower, key, errdefs.ErrNotImplemented)
	}
	fault.Point(fault.FreezeLent)
	err = step(ctx, retried(func() error {
		return sn.Commit(ctx, name, borrower, snapshots.WithLabels(labels))
	}, func(err error) bool {
		// The borrower is gone or name is there: committed, if name exists.
		if !errdefs.IsNotFound(err) && !errdefs.IsAlreadyExists(err) {
			return false
		}
		_, serr := sn.Stat(ctx, name)
		return serr == nil
	}))
	if err != nil {
		removeQuietly(ctx, sn, borrower, "the borrower of a failed freeze")
		return fmt.Errorf("commit the upper of %s as %s: %w", key, name, err)
	}
	fault.Point(fault.FreezeCommitted)
	return nil
}

// step runs one call of a freeze, again while containerd or the snapshotter does not answer.
func step(ctx context.Context, op func() error) error {
	return RetryUnavailable(ctx, RetryLimit, op)
}

// retried wraps op for step: once a try has failed (its answer may be what was lost), an error
// that done accepts means that try did it.
func retried(op func() error, done func(error) bool) func() error {
	tried := false
	return func() error {
		err := op()
		if tried && err != nil && done(err) {
			return nil
		}
		tried = true
		return err
	}
}

// frozenRootfs is a container whose upper has been committed as name: steps 3 to 5 of Rootfs.
type frozenRootfs struct {
	sn     snapshots.Snapshotter
	cs     Containers
	id     string
	key    string            // the container's key, lent to name
	name   string            // the committed layer
	labels map[string]string // key's
	on     string            // the key the container's record names
	fresh  string            // the key it was moved to
}

// move points the container at a fresh key on name, hands key's upper over to name and removes
// key.
func (fr *frozenRootfs) move(ctx context.Context) error {
	fr.on = fr.key
	labels := maps.Clone(fr.labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelReplaces] = fr.key
	var sw Switched
	err := step(ctx, func() (err error) {
		sw, err = prepareFresh(ctx, fr.sn, fr.id, fr.name, labels)
		return err
	})
	if err != nil {
		removeQuietly(ctx, fr.sn, fr.name, "the layer of a failed freeze")
		return err
	}
	if err := step(ctx, func() error { return repoint(ctx, fr.sn, fr.cs, fr.id, fr.key, sw.Key, nil) }); err != nil {
		removeQuietly(ctx, fr.sn, fr.name, "the layer of a failed freeze")
		return err
	}
	fr.on, fr.fresh = sw.Key, sw.Key
	fault.Point(fault.FreezeMoved)
	// The old key is referenced by nothing now: its directory becomes name's, and the key goes.
	// Should the hand-over fail, containerd's collector hands it over when it removes the key.
	if _, err := fr.sn.Update(ctx, snapshots.Info{Name: fr.key, Labels: map[string]string{LabelHandOver: fr.name}}, "labels."+LabelHandOver); err != nil {
		log.G(ctx).WithError(err).WithField("key", fr.key).Warn("hand over the frozen upper (the collector does it with the key)")
	}
	fault.Point(fault.FreezeHandedOver)
	err = step(ctx, func() error {
		if err := fr.sn.Remove(ctx, fr.key); !errdefs.IsNotFound(err) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("freeze the rootfs of container %s: it is on %s, its former key %s could not be removed: %w", fr.id, sw.Key, fr.key, err)
	}
	return nil
}

// rename prepares key again on name and points the container back at it.
func (fr *frozenRootfs) rename(ctx context.Context) error {
	labels := maps.Clone(fr.labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelReplaces] = fr.fresh
	err := step(ctx, retried(func() error {
		_, err := fr.sn.Prepare(ctx, fr.key, fr.name, snapshots.WithLabels(labels))
		return err
	}, errdefs.IsAlreadyExists))
	if err != nil {
		return fmt.Errorf("freeze the rootfs of container %s: it is on %s, preparing %s again failed: %w", fr.id, fr.fresh, fr.key, err)
	}
	if err := step(ctx, func() error { return repoint(ctx, fr.sn, fr.cs, fr.id, fr.fresh, fr.key, nil) }); err != nil {
		return err
	}
	fr.on = fr.key
	fault.Point(fault.FreezeRenamed)
	removeReplaced(ctx, fr.sn, fr.key, fr.fresh)
	return nil
}

// borrows reports whether the snapshot borrower (its mounts) borrowed the upper directory upper:
// its own upper is a link to it. A snapshotter that does not know LabelUpperOf ignores it.
func borrows(borrower string, mounts []mount.Mount, upper string) bool {
	own, err := UpperDir(borrower, mounts)
	if err != nil {
		return false
	}
	link, err := os.Readlink(own)
	return err == nil && filepath.Join(filepath.Dir(own), link) == filepath.Clean(upper)
}

// removeQuietly removes key, logging a failure: what remains is under the caller's lease.
func removeQuietly(ctx context.Context, sn snapshots.Snapshotter, key, what string) {
	if err := sn.Remove(context.WithoutCancel(ctx), key); err != nil && !errdefs.IsNotFound(err) {
		log.G(ctx).WithError(err).WithField("key", key).Warnf("remove %s (its lease frees it)", what)
	}
}

// UpperDir is the directory an active snapshot's mounts write to: the overlay's upperdir, or the
// bind-mounted directory of a snapshot without parent.
func UpperDir(key string, ms []mount.Mount) (string, error) {
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
	return "", fmt.Errorf("snapshot %s is not an overlay with an upper directory (mounts %v): a checkpoint of a running task's filesystem needs one: %w", key, ms, errdefs.ErrNotImplemented)
}
