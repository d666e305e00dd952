package diff

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/continuity/fs"
	"github.com/containerd/continuity/sysx"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/archive"
)

// layers is a recognised cklite active snapshot: its upperdir and how to
// reach the lower layers it was mounted over.
type layers struct {
	upperDir string
	// lowerDirs are the upper's lowerdirs, topmost first; empty for a
	// snapshot without parent.
	lowerDirs []string
	// lowerMount is the caller's lower mount when only mounting it shows the
	// merged lower layers; nil when lowerDirs has at most one entry.
	lowerMount []mount.Mount
}

func snapshotsDir(root string) string {
	return filepath.Join(root, "snapshots") + string(filepath.Separator)
}

// notCklite wraps ErrNotImplemented so that containerd's diff service falls
// through to the next differ.
func notCklite(format string, args ...any) error {
	return fmt.Errorf("not a cklite active snapshot: %s: %w", fmt.Sprintf(format, args...), errdefs.ErrNotImplemented)
}

// match recognises the mounts rootfs.CreateDiff passes for a cklite active
// snapshot (Mounts(key)) and its parent (View(parent)).
func (d *Differ) match(lower, upper []mount.Mount) (*layers, error) {
	if len(upper) != 1 {
		return nil, notCklite("%d upper mounts", len(upper))
	}
	u := upper[0]
	if u.Target != "" {
		return nil, notCklite("upper mount has target %q", u.Target)
	}
	if slices.ContainsFunc(u.Options, isIDMapOption) {
		// The upperdir holds host ids while the walking differ would see
		// the mapped ones.
		return nil, notCklite("idmapped upper mount")
	}
	l := &layers{}
	switch u.Type {
	case "bind", "rbind":
		if slices.Contains(u.Options, "ro") {
			return nil, notCklite("read-only bind upper")
		}
		l.upperDir = u.Source
	case "overlay":
		for _, o := range u.Options {
			if dir, ok := strings.CutPrefix(o, "upperdir="); ok {
				l.upperDir = dir
			}
		}
		l.lowerDirs = lowerDirs(u.Options)
		if len(l.lowerDirs) == 0 {
			return nil, notCklite("overlay upper without lowerdir")
		}
	default:
		return nil, notCklite("upper mount type %q", u.Type)
	}
	if !strings.HasPrefix(filepath.Clean(l.upperDir), d.snapshots) {
		return nil, notCklite("upper %q is not under %s", l.upperDir, d.snapshots)
	}

	switch {
	case len(lower) == 0:
		if len(l.lowerDirs) != 0 {
			return nil, notCklite("no lower mount for an upper with %d lowerdirs", len(l.lowerDirs))
		}
	case len(lower) > 1:
		return nil, notCklite("%d lower mounts", len(lower))
	case lower[0].Target != "" || slices.ContainsFunc(lower[0].Options, isIDMapOption):
		return nil, notCklite("lower mount with target or idmap")
	case (lower[0].Type == "bind" || lower[0].Type == "rbind") && len(l.lowerDirs) == 0:
		// rootfs.CreateDiff views the parent "" of a snapshot without
		// parent, which the overlay layout mounts as an empty directory.
		empty, err := isEmptyDir(lower[0].Source)
		if err != nil {
			return nil, notCklite("lower bind for an upper without parent: %v", err)
		}
		if !empty {
			return nil, notCklite("lower bind of %q for an upper without parent is not empty", lower[0].Source)
		}
	case lower[0].Type == "bind" || lower[0].Type == "rbind":
		if len(l.lowerDirs) != 1 || filepath.Clean(lower[0].Source) != filepath.Clean(l.lowerDirs[0]) {
			return nil, notCklite("lower bind of %q is not the upper's lowerdir", lower[0].Source)
		}
	case lower[0].Type == "overlay":
		if slices.ContainsFunc(lower[0].Options, func(o string) bool { return strings.HasPrefix(o, "upperdir=") }) {
			return nil, notCklite("lower overlay has an upperdir of its own")
		}
		if !slices.Equal(lowerDirs(lower[0].Options), l.lowerDirs) {
			return nil, notCklite("lower overlay has other lowerdirs than the upper")
		}
		if len(l.lowerDirs) > 1 {
			l.lowerMount = lower
		}
	default:
		return nil, notCklite("lower mount type %q", lower[0].Type)
	}
	return l, nil
}

func isEmptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return len(names) == 0, err
}

func isIDMapOption(o string) bool {
	return strings.HasPrefix(o, "uidmap=") || strings.HasPrefix(o, "gidmap=")
}

// lowerDirs returns the overlay's lowerdirs in option order, topmost first,
// from either "lowerdir=a:b" or repeated "lowerdir+=a" options.
func lowerDirs(options []string) []string {
	var dirs []string
	for _, o := range options {
		if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			dirs = append(dirs, strings.Split(v, ":")...)
		} else if v, ok := strings.CutPrefix(o, "lowerdir+="); ok {
			dirs = append(dirs, v)
		}
	}
	return dirs
}

// withBase calls f with a directory showing the merged lower layers, or ""
// for a snapshot without parent. A single lowerdir is used in place; only a
// multi-layer lower is mounted, which is O(1) in the size of the layers.
func (l *layers) withBase(ctx context.Context, f func(base string) error) error {
	switch {
	case len(l.lowerDirs) == 0:
		return f("")
	case l.lowerMount == nil:
		return f(l.lowerDirs[0])
	}
	return mount.WithReadonlyTempMount(ctx, l.lowerMount, f)
}

// writeDiff writes the OCI layer tar of the upperdir's changes to w.
func (l *layers) writeDiff(ctx context.Context, w io.Writer, sourceDateEpoch *time.Time) error {
	// The same change writer options as archive.WriteDiff, which walking uses.
	var opts []archive.ChangeWriterOpt
	if sourceDateEpoch != nil {
		opts = append(opts, archive.WithModTimeUpperBound(*sourceDateEpoch))
	}
	return l.withBase(ctx, func(base string) error {
		cw := archive.NewChangeWriter(w, l.upperDir, opts...)
		var err error
		if base == "" {
			// Without parent the upper is a plain directory that walking
			// would diff against an empty one: everything is added, and
			// nothing in it has overlay meaning.
			err = fs.Changes(ctx, "", l.upperDir, cw.HandleChange)
		} else {
			err = diffUpper(l.upperDir, base, cw.HandleChange)
		}
		if err != nil {
			return fmt.Errorf("failed to create diff tar stream of %s: %w", l.upperDir, err)
		}
		return cw.Close()
	})
}

// diffUpper reports to fn, in lexical order like fs.Changes, the changes the
// overlay upperdir upper makes to the merged lower layers shown at base. It
// walks upper only; base is looked up for the paths upper holds.
//
// It does what continuity's fs.DiffDirChanges(DiffSourceOverlayFS) does, as
// used by containerd's erofs differ, except that DiffDirChanges fails with
// ENOTDIR below a directory that replaced a file, follows base symlinks
// (through the host's root for absolute ones), and turns a whiteout with
// nothing below it (such as a deleted dangling symlink) into a character
// device entry. It also writes an opaque directory before its opaque marker,
// so the change writer does not write the directory twice.
func diffUpper(upper, base string, fn fs.ChangeFunc) error {
	root, err := os.OpenFile(base, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("failed to open lower layers: %w", err)
	}
	defer root.Close()
	return filepath.Walk(upper, func(p string, f os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil || rel == "." {
			return err
		}
		name := string(filepath.Separator) + rel
		below, err := lstatIn(root, rel)
		if err != nil {
			return err
		}
		kind := fs.ChangeKind(fs.ChangeKindModify)
		if below == nil {
			kind = fs.ChangeKindAdd
		}
		switch {
		case isWhiteout(f):
			if below == nil {
				return nil
			}
			return fn(fs.ChangeKindDelete, name, nil, nil)
		case f.IsDir():
			opaque, _, err := overlayXattr(p, "opaque")
			if err != nil {
				return err
			}
			if string(opaque) == "y" {
				if err := fn(kind, name, f, nil); err != nil {
					return err
				}
				// The change writer turns the deletion of ".wh..opq"
				// into the OCI opaque whiteout ".wh..wh..opq".
				return fn(fs.ChangeKindDelete, filepath.Join(name, ".wh..opq"), nil, nil)
			}
			// A directory copied up only because something below it
			// changed is not a change itself; the change writer adds it
			// as the parent of what changed.
			if below != nil && below.IsDir() && f.Mode() == below.Mode() && f.Size() == below.Size() && f.ModTime().Equal(below.ModTime()) {
				return nil
			}
		}
		if err := checkSelfContained(p, f); err != nil {
			return err
		}
		return fn(kind, name, f, nil)
	})
}

// lstatIn returns the lstat of rel below root, resolving symlinks on the way
// as if root were "/", or nil when nothing is there. A whiteout counts as
// nothing, as in an overlay: a single lowerdir is read in place, unmounted.
func lstatIn(root *os.File, rel string) (os.FileInfo, error) {
	fd, err := unix.Openat2(int(root.Fd()), rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to look up %s in lower layers: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || isWhiteout(fi) {
		return nil, err
	}
	return fi, nil
}

// isWhiteout tells overlay's whiteout, a 0/0 character device.
func isWhiteout(f os.FileInfo) bool {
	st, ok := f.Sys().(*syscall.Stat_t)
	return ok && f.Mode()&os.ModeCharDevice != 0 && st.Rdev == 0
}

// overlayXattr returns the overlay xattr "trusted.overlay.<name>", or
// "user.overlay.<name>" for overlays mounted with userxattr, of path, and
// whether path has it (some, like metacopy, may be empty).
func overlayXattr(path, name string) ([]byte, bool, error) {
	for _, attr := range []string{"trusted.overlay." + name, "user.overlay." + name} {
		v, err := sysx.LGetxattr(path, attr)
		switch {
		case err == nil:
			return v, true, nil
		case errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP):
		default:
			return nil, false, fmt.Errorf("failed to read %s of %s: %w", attr, path, err)
		}
	}
	return nil, false, nil
}

// checkSelfContained fails with NotImplemented when an upperdir entry takes
// its content from the lower layers: a directory renamed with redirect_dir
// or a metadata-only copy-up (metacopy). Copying such an entry from the
// upperdir would lose that content; the walking differ sees it merged.
func checkSelfContained(path string, f os.FileInfo) error {
	var attr string
	switch {
	case f.IsDir():
		attr = "redirect"
	case f.Mode().IsRegular():
		attr = "metacopy"
	default:
		return nil
	}
	_, ok, err := overlayXattr(path, attr)
	if err != nil {
		return err
	}
	if ok {
		return notCklite("%s has overlay.%s", path, attr)
	}
	return nil
}
