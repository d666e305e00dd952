//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay/overlayutils"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cklite/cklite/pkg/fault"
	"github.com/cklite/cklite/snapshotter/freeze"
)

// Snapshotter is a containerd snapshotter on overlayfs whose Commit is O(1), which makes a
// Commit+Prepare pair on a container's snapshot a freeze (see the package documentation).
type Snapshotter struct {
	root       string
	ms         *storage.MetaStore
	options    []string // overlay mount options appended to every overlay mount
	asyncClean bool
	merges     *mergeSet
	dedup      *dedupStore // nil when dedup is off

	usageMu sync.Mutex
	usage   map[string]snapshots.Usage // committed snapshots are immutable: usage by id, computed once
}

// Opt configures a Snapshotter.
type Opt func(*config) error

type config struct {
	mountOptions []string
	asyncRemove  bool
	fanOut       int
	dedup        bool
}

// WithMountOptions adds options to every overlay mount (not to bind mounts).
func WithMountOptions(options ...string) Opt {
	return func(c *config) error {
		c.mountOptions = append(c.mountOptions, options...)
		return nil
	}
}

// AsynchronousRemove leaves the directories of removed snapshots for Cleanup, as containerd's
// overlay snapshotter does with the same option: Remove then only touches metadata.
func AsynchronousRemove(c *config) error {
	c.asyncRemove = true
	return nil
}

// WithMergeFanOut sets how many layers one merged layer covers (see merge.go); the default,
// DefaultFanOut, keeps chains of ten thousand freezes under a hundred overlay lower layers.
func WithMergeFanOut(n int) Opt {
	return func(c *config) error {
		if n < 2 {
			return fmt.Errorf("merge fan-out %d: must be at least 2: %w", n, errdefs.ErrInvalidArgument)
		}
		c.fanOut = n
		return nil
	}
}

// WithDedup makes identical files of committed snapshots share storage (see dedup.go).
func WithDedup(c *config) error {
	c.dedup = true
	return nil
}

// New opens (or creates) a snapshotter under root. It refuses a root whose filesystem cannot hold
// overlay layers (no d_type, no overlayfs) and, before serving, removes what an interrupted
// run left behind: half-made snapshot and merge directories, layers no snapshot refers to.
func New(ctx context.Context, root string, opts ...Opt) (*Snapshotter, error) {
	cfg := config{fanOut: DefaultFanOut}
	for _, opt := range opts {
		if err := opt(&cfg); err != nil {
			return nil, err
		}
	}
	if err := overlayutils.Supported(root); err != nil {
		return nil, fmt.Errorf("snapshotter root %s cannot hold overlay layers: %w", root, err)
	}
	if err := os.MkdirAll(filepath.Join(root, "snapshots"), 0o700); err != nil {
		return nil, fmt.Errorf("snapshotter root %s: %w", root, err)
	}
	ms, err := storage.NewMetaStore(filepath.Join(root, "metadata.db"))
	if err != nil {
		return nil, fmt.Errorf("opening metadata in %s: %w", root, err)
	}
	s := &Snapshotter{
		root:       root,
		ms:         ms,
		options:    overlayOptions(root, cfg.mountOptions),
		asyncClean: cfg.asyncRemove,
		usage:      map[string]snapshots.Usage{},
	}
	s.merges = newMergeSet(filepath.Join(root, "snapshots"), cfg.fanOut)
	if cfg.dedup {
		if s.dedup, err = openDedupStore(filepath.Join(root, "dedup")); err != nil {
			ms.Close()
			return nil, err
		}
	}
	if err := s.cleanup(ctx, true); err != nil {
		s.Close()
		return nil, fmt.Errorf("cleaning up %s: %w", root, err)
	}
	if err := s.merges.load(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// overlayOptions picks the options containerd's overlay snapshotter would: userxattr when the
// kernel needs it (rootless), index=off so a layer can appear in more than one mount.
func overlayOptions(root string, configured []string) []string {
	options := append([]string(nil), configured...)
	if !hasOption(options, "userxattr") {
		userxattr, err := overlayutils.NeedsUserXAttr(root)
		if err != nil {
			log.L.WithError(err).Warnf("cannot detect whether overlay needs \"userxattr\", assuming %v", userxattr)
		}
		if userxattr {
			options = append(options, "userxattr")
		}
	}
	if _, err := os.Stat("/sys/module/overlay/parameters/index"); err == nil && !hasOption(options, "index") {
		options = append(options, "index=off")
	}
	return options
}

func hasOption(options []string, key string) bool {
	for _, option := range options {
		if k, _, _ := strings.Cut(option, "="); k == key {
			return true
		}
	}
	return false
}

// Stat returns the info of an active or committed snapshot by key or name.
func (s *Snapshotter) Stat(ctx context.Context, key string) (info snapshots.Info, err error) {
	err = s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		_, info, _, err = storage.GetInfo(ctx, key)
		return err
	})
	return info, err
}

// Update changes the labels of a snapshot. Setting freeze.LabelHandOver hands its upper over to
// the snapshot it is lent to (lend.go).
func (s *Snapshotter) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (newInfo snapshots.Info, err error) {
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		if slices.Contains(fieldpaths, "labels."+freeze.LabelHandOver) {
			id, _, _, err := storage.GetInfo(ctx, info.Name)
			if err != nil {
				return err
			}
			if err := s.handOver(ctx, id); err != nil {
				return err
			}
		}
		newInfo, err = storage.UpdateInfo(ctx, info, fieldpaths...)
		return err
	})
	return newInfo, err
}

// Usage returns the disk space an active snapshot's upper, or a committed layer, takes. Commit does
// not measure (that walk would make a freeze O(files)), so a committed layer is measured on the
// first call and remembered: it can no longer change.
func (s *Snapshotter) Usage(ctx context.Context, key string) (snapshots.Usage, error) {
	var (
		id   string
		info snapshots.Info
	)
	if err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) (err error) {
		id, info, _, err = storage.GetInfo(ctx, key)
		return err
	}); err != nil {
		return snapshots.Usage{}, err
	}
	if info.Kind == snapshots.KindCommitted {
		s.usageMu.Lock()
		defer s.usageMu.Unlock()
		if u, ok := s.usage[id]; ok {
			return u, nil
		}
	}
	// A borrowed upper is measured where it is; its lender may still change it (lend.go).
	upper, borrowed := realUpper(s.upperPath(id))
	du, err := fs.DiskUsage(ctx, upper)
	if err != nil {
		return snapshots.Usage{}, fmt.Errorf("measuring snapshot %s: %w", key, err)
	}
	if info.Kind == snapshots.KindCommitted && !borrowed {
		s.usage[id] = snapshots.Usage(du)
	}
	return snapshots.Usage(du), nil
}

// Prepare creates an active snapshot on parent: the writable layer of a container.
func (s *Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.createSnapshot(ctx, snapshots.KindActive, key, parent, opts)
}

// View creates a read-only snapshot of parent.
func (s *Snapshotter) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.createSnapshot(ctx, snapshots.KindView, key, parent, opts)
}

// Mounts returns the mounts of an active or view snapshot.
func (s *Snapshotter) Mounts(ctx context.Context, key string) (_ []mount.Mount, err error) {
	var snap storage.Snapshot
	if err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		snap, err = storage.GetSnapshot(ctx, key)
		return err
	}); err != nil {
		return nil, fmt.Errorf("mounts of %s: %w", key, err)
	}
	return s.mounts(ctx, snap)
}

// Commit turns the active snapshot key into the committed, immutable snapshot name. It is O(1):
// the upper directory becomes the layer as it is, nothing is walked or copied. An upper that is
// still mounted somewhere would keep changing under its new name, so that is refused.
func (s *Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	return s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		id, info, _, err := storage.GetInfo(ctx, key)
		if err != nil {
			return fmt.Errorf("committing %s: %w", key, err)
		}
		if info.Kind != snapshots.KindActive {
			return fmt.Errorf("committing %s: it is %s, only an active snapshot can be committed: %w", key, info.Kind, errdefs.ErrFailedPrecondition)
		}
		upper, borrowed := realUpper(s.upperPath(id))
		if at, err := mountedUpper(upper); err != nil {
			return fmt.Errorf("committing %s: %w", key, err)
		} else if at != "" {
			return fmt.Errorf("committing %s: its upper layer is still mounted at %s (stop or checkpoint the task first): %w", key, at, errdefs.ErrFailedPrecondition)
		}
		if _, err := storage.CommitActive(ctx, key, name, snapshots.Usage{}, opts...); err != nil {
			return fmt.Errorf("committing %s as %s: %w", key, name, err)
		}
		fault.Point(fault.SnapshotterCommit)
		if s.dedup != nil && !borrowed { // a borrowed upper is deduplicated once handed over
			s.dedup.enqueue(s.upperPath(id))
		}
		return nil
	})
}

// Remove deletes a snapshot. Its directory goes at once unless removal is asynchronous, in
// which case Cleanup reclaims it; an upper it lent is handed over first (lend.go).
func (s *Snapshotter) Remove(ctx context.Context, key string) (err error) {
	var removals []string
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		id, _, err := storage.Remove(ctx, key)
		if err != nil {
			return fmt.Errorf("removing snapshot %s: %w", key, err)
		}
		if err := s.handOver(ctx, id); err != nil {
			return fmt.Errorf("removing snapshot %s: %w", key, err)
		}
		s.usageMu.Lock()
		delete(s.usage, id)
		s.usageMu.Unlock()
		if !s.asyncClean {
			removals, err = s.unreferencedDirs(ctx, false)
		}
		return err
	})
	if err != nil {
		return err
	}
	// The metadata no longer names these directories: failing to delete them now only costs
	// space until the next Cleanup.
	s.removeDirs(ctx, removals)
	return nil
}

// Walk calls fn for every snapshot matching the filters.
func (s *Snapshotter) Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) error {
	return s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		return storage.WalkInfo(ctx, fn, filters...)
	})
}

// Cleanup removes every directory no snapshot refers to: removed snapshots, merges whose top
// layer is gone, and leftovers of a run killed mid-operation.
func (s *Snapshotter) Cleanup(ctx context.Context) error {
	return s.cleanup(ctx, false)
}

// cleanup removes unreferenced directories; at startup also merges a killed run left half-built.
func (s *Snapshotter) cleanup(ctx context.Context, startup bool) error {
	var dirs []string
	// A write transaction keeps other writers out while the directory list is compared.
	if err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) (err error) {
		dirs, err = s.unreferencedDirs(ctx, startup)
		return err
	}); err != nil {
		return err
	}
	s.removeDirs(ctx, dirs)
	if s.dedup != nil {
		return s.dedup.prune(ctx)
	}
	return nil
}

func (s *Snapshotter) unreferencedDirs(ctx context.Context, startup bool) ([]string, error) {
	ids, err := storage.IDMap(ctx)
	if err != nil && !errdefs.IsNotFound(err) { // not found: no snapshot was ever made
		return nil, err
	}
	dir := filepath.Join(s.root, "snapshots")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var unreferenced []string
	for _, e := range entries {
		name := e.Name()
		if _, ok := ids[name]; ok {
			continue
		}
		if !startup && isMergeInProgress(name) {
			continue
		}
		if top, _, ok := parseMergeName(name); ok {
			if _, ok := ids[top]; ok {
				continue
			}
		}
		unreferenced = append(unreferenced, filepath.Join(dir, name))
	}
	return unreferenced, nil
}

func (s *Snapshotter) removeDirs(ctx context.Context, dirs []string) {
	for _, dir := range dirs {
		s.merges.forget(filepath.Base(dir))
		if err := os.RemoveAll(dir); err != nil {
			log.G(ctx).WithError(err).WithField("path", dir).Warn("failed to remove snapshot directory")
		}
	}
}

// Close stops background work and closes the metadata store.
func (s *Snapshotter) Close() error {
	s.merges.close()
	if s.dedup != nil {
		s.dedup.close()
	}
	return s.ms.Close()
}

func (s *Snapshotter) createSnapshot(ctx context.Context, kind snapshots.Kind, key, parent string, opts []snapshots.Opt) (_ []mount.Mount, err error) {
	var (
		snap    storage.Snapshot
		tmp     string
		created string
	)
	defer func() {
		// The transaction failed: nothing names these directories.
		for _, dir := range []string{tmp, created} {
			if err != nil && dir != "" {
				if err1 := os.RemoveAll(dir); err1 != nil {
					log.G(ctx).WithError(err1).WithField("path", dir).Warn("failed to remove directory of a failed snapshot")
				}
			}
		}
	}()
	if err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) (err error) {
		dir := filepath.Join(s.root, "snapshots")
		if tmp, err = prepareDirectory(dir, kind); err != nil {
			return err
		}
		if snap, err = storage.CreateSnapshot(ctx, kind, key, parent, opts...); err != nil {
			return fmt.Errorf("creating snapshot %s: %w", key, err)
		}
		if err := s.borrowAsked(ctx, kind, key, parent, opts, tmp, snap.ID); err != nil {
			return fmt.Errorf("creating snapshot %s: %w", key, err)
		}
		if len(snap.ParentIDs) > 0 && !isLink(filepath.Join(tmp, "fs")) {
			// The new upper's root takes the owner of the parent's root, as overlay's does, so that
			// a layer made by a non-root image keeps working.
			st, err := os.Stat(s.upperPath(snap.ParentIDs[0]))
			if err != nil {
				return fmt.Errorf("parent layer of %s: %w", key, err)
			}
			stat := st.Sys().(*syscall.Stat_t)
			if err := os.Lchown(filepath.Join(tmp, "fs"), int(stat.Uid), int(stat.Gid)); err != nil {
				return err
			}
		}
		created = filepath.Join(dir, snap.ID)
		if err := os.Rename(tmp, created); err != nil {
			return err
		}
		tmp = ""
		return nil
	}); err != nil {
		return nil, err
	}
	return s.mounts(ctx, snap)
}

// borrowAsked makes the new active snapshot's upper (in directory tmp, id id) a borrowed one
// when its labels ask for it (freeze.LabelUpperOf, lend.go).
func (s *Snapshotter) borrowAsked(ctx context.Context, kind snapshots.Kind, key, parent string, opts []snapshots.Opt, tmp, id string) error {
	var info snapshots.Info
	for _, opt := range opts {
		if err := opt(&info); err != nil {
			return err
		}
	}
	path, ok := info.Labels[freeze.LabelUpperOf]
	if !ok {
		return nil
	}
	if kind != snapshots.KindActive {
		return fmt.Errorf("only an active snapshot borrows an upper: %w", errdefs.ErrInvalidArgument)
	}
	lender, err := s.lender(ctx, key, parent, path)
	if err != nil {
		return err
	}
	return s.borrow(tmp, id, lender)
}

func isLink(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode()&os.ModeSymlink != 0
}

// prepareDirectory makes a snapshot directory under a temporary name: it becomes the snapshot's
// only when renamed to the id inside the metadata transaction, so a crash never leaves a
// half-made directory under a name that counts.
func prepareDirectory(dir string, kind snapshots.Kind) (string, error) {
	tmp, err := os.MkdirTemp(dir, "new-")
	if err != nil {
		return "", fmt.Errorf("creating snapshot directory: %w", err)
	}
	if err := os.Mkdir(filepath.Join(tmp, "fs"), 0o755); err != nil {
		return tmp, err
	}
	if kind == snapshots.KindActive {
		if err := os.Mkdir(filepath.Join(tmp, "work"), 0o711); err != nil {
			return tmp, err
		}
	}
	return tmp, nil
}

// mounts returns the mounts of an active or view snapshot: a bind mount of its own directory
// when it has no parent, a bind mount for a view of a single (possibly merged) layer, otherwise
// overlay with the parent chain as lower layers (merged where the chain is deep, see merge.go).
func (s *Snapshotter) mounts(ctx context.Context, snap storage.Snapshot) ([]mount.Mount, error) {
	if len(snap.ParentIDs) == 0 {
		mode := "rw"
		if snap.Kind == snapshots.KindView {
			mode = "ro"
		}
		return []mount.Mount{{Type: "bind", Source: s.upperPath(snap.ID), Options: []string{mode, "rbind"}}}, nil
	}
	lowers, err := s.merges.lowerDirs(ctx, snap.ParentIDs)
	if err != nil {
		return nil, err
	}
	if snap.Kind == snapshots.KindView && len(lowers) == 1 {
		// Without an upper, overlayfs wants two lower dirs: a view of one layer, or of a chain
		// that one merge stands for, is a read-only bind mount of that directory.
		return []mount.Mount{{Type: "bind", Source: lowers[0], Options: []string{"ro", "rbind"}}}, nil
	}
	var options []string
	if snap.Kind == snapshots.KindActive {
		options = append(options, "workdir="+s.workPath(snap.ID), "upperdir="+s.upperPath(snap.ID))
	}
	options = append(options, "lowerdir="+strings.Join(lowers, ":"))
	options = append(options, s.options...)
	return []mount.Mount{{Type: "overlay", Source: "overlay", Options: options}}, nil
}

func (s *Snapshotter) upperPath(id string) string {
	return filepath.Join(s.root, "snapshots", id, "fs")
}

func (s *Snapshotter) workPath(id string) string {
	return filepath.Join(s.root, "snapshots", id, "work")
}
