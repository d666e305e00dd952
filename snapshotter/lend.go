//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/fault"
	"github.com/cklite/cklite/snapshotter/freeze"
)

// Lending an upper: how the switch rule's freeze (freeze.Rootfs) turns a container's upper into
// a committed layer in O(1) while the container's snapshot key is never absent. containerd's
// Commit consumes the active key it commits, so the key the container refers to cannot be the
// one committed; its upper directory must become the layer nonetheless, without a copy.
//
//   - Prepare with label freeze.LabelUpperOf (the upper directory of an active snapshot, the
//     lender, on the same parent and not mounted) makes a borrower whose upper is a symbolic link
//     to the lender's, and leaves a link "lent-to" in the lender's directory naming the borrower.
//     Both show the same files; the borrower is committed as the layer (Commit resolves the link
//     to refuse a mounted upper), and stays a link until the hand-over.
//   - The hand-over exchanges the two with one renameat2(RENAME_EXCHANGE): the borrower gets the
//     directory, the lender the link. It runs on an Update that sets freeze.LabelHandOver on the
//     lender (the caller's container refers to another key by then) and on the lender's Remove
//     (containerd's collector, after a crash before that Update). It refuses while the lender's
//     upper is mounted: a running task would go on writing into the layer.
//
// Every step is one transaction of the metadata plus at most one rename, so a crash leaves the
// lender whole (before the exchange) or the borrower whole (after it). A borrower removed before
// the hand-over (its lease expired: the container stayed on the lender) takes only its link with
// it; the lender's "lent-to" then names nothing and is ignored. The hand-over checks that the
// borrower still exists and links to the lender, so a stale "lent-to" never moves a directory.

// lentTo names, in a lender's snapshot directory, the id of the snapshot its upper is lent to.
const lentTo = "lent-to"

// lenderLink is what a borrower's upper links to: the lender's upper, relative to the borrower's
// directory.
func lenderLink(lender string) string {
	return filepath.Join("..", lender, "fs")
}

// lender returns the id of the active snapshot whose upper directory path is, checked against
// the snapshot being prepared on parent as key: an active snapshot of the same containerd
// namespace on the same parent, not mounted.
func (s *Snapshotter) lender(ctx context.Context, key, parent, path string) (string, error) {
	id := filepath.Base(filepath.Dir(path))
	if filepath.Clean(path) != s.upperPath(id) {
		return "", fmt.Errorf("%s=%q is not the upper directory of a snapshot of %s: %w", freeze.LabelUpperOf, path, s.root, errdefs.ErrInvalidArgument)
	}
	ids, err := storage.IDMap(ctx)
	if err != nil {
		return "", err
	}
	lenderKey, ok := ids[id]
	if !ok {
		return "", fmt.Errorf("no snapshot has the upper directory %s: %w", path, errdefs.ErrNotFound)
	}
	_, info, _, err := storage.GetInfo(ctx, lenderKey)
	switch {
	case err != nil:
		return "", err
	case info.Kind != snapshots.KindActive:
		return "", fmt.Errorf("%s is a %s snapshot: only an active one lends its upper: %w", lenderKey, info.Kind, errdefs.ErrFailedPrecondition)
	case info.Parent != parent:
		return "", fmt.Errorf("%s is on %q, %s on %q: a borrower must show the lender's files: %w", lenderKey, info.Parent, key, parent, errdefs.ErrFailedPrecondition)
	case namespaceOf(lenderKey) != namespaceOf(key):
		return "", fmt.Errorf("%s is in another namespace than %s: %w", lenderKey, key, errdefs.ErrPermissionDenied)
	}
	if at, err := mountedUpper(path); err != nil {
		return "", err
	} else if at != "" {
		return "", fmt.Errorf("the upper of %s is mounted at %s: stop its task before lending it: %w", lenderKey, at, errdefs.ErrFailedPrecondition)
	}
	return id, nil
}

// namespaceOf is the containerd namespace of a backend key, "<namespace>/<seq>/<key>".
func namespaceOf(key string) string {
	ns, _, _ := strings.Cut(key, "/")
	return ns
}

// borrow makes the upper of the new snapshot directory tmp (id borrower, not yet in place) a link
// to lender's, and records the loan in the lender's directory.
func (s *Snapshotter) borrow(tmp, borrower, lender string) error {
	upper := filepath.Join(tmp, "fs")
	if err := os.Remove(upper); err != nil {
		return err
	}
	if err := os.Symlink(lenderLink(lender), upper); err != nil {
		return err
	}
	marker := filepath.Join(s.root, "snapshots", lender, lentTo)
	if err := os.Symlink(borrower, marker+".new"); err != nil {
		return err
	}
	return os.Rename(marker+".new", marker)
}

// handOver gives the upper directory of snapshot id, if it is lent, to its borrower. It runs in a
// write transaction of the metadata.
func (s *Snapshotter) handOver(ctx context.Context, id string) error {
	marker := filepath.Join(s.root, "snapshots", id, lentTo)
	borrower, err := os.Readlink(marker)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("hand over the upper of snapshot %s: %w", id, err)
	}
	ids, err := storage.IDMap(ctx)
	if err != nil {
		return err
	}
	link, err := os.Readlink(s.upperPath(borrower))
	if _, ok := ids[borrower]; !ok || err != nil || link != lenderLink(id) {
		return os.Remove(marker) // the borrower is gone, or has the directory already
	}
	if at, err := mountedUpper(s.upperPath(id)); err != nil {
		return err
	} else if at != "" {
		return fmt.Errorf("the upper of snapshot %s is lent to %s and still mounted at %s: %w", id, borrower, at, errdefs.ErrFailedPrecondition)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, s.upperPath(id), unix.AT_FDCWD, s.upperPath(borrower), unix.RENAME_EXCHANGE); err != nil {
		return fmt.Errorf("hand over the upper of snapshot %s to %s: %w", id, borrower, err)
	}
	fault.Point(fault.SnapshotterHandOver)
	if s.dedup != nil {
		s.dedup.enqueue(s.upperPath(borrower))
	}
	log.G(ctx).WithFields(log.Fields{"lender": id, "borrower": borrower}).Debug("upper handed over")
	return os.Remove(marker)
}

// realUpper is the directory a snapshot's upper directory stands for: the lender's, when it is
// borrowed, and whether it is.
func realUpper(upper string) (string, bool) {
	link, err := os.Readlink(upper)
	if err != nil {
		return upper, false
	}
	return filepath.Join(filepath.Dir(upper), link), true
}
