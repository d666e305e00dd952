//go:build linux

package snapshotter

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// overlayfs marks its changes with xattrs in the trusted namespace, or the user namespace when
// mounted with userxattr; a layer made one way is read the same way.
var overlayXattrPrefixes = []string{"trusted.overlay.", "user.overlay."}

// applyLayer puts the overlay layer src on top of dst, which holds the layers below it merged:
// afterwards dst shows, as a single lower layer, what overlayfs shows for the two stacked.
//
// overlayfs looks a path up from the top layer down and stops at the first entry that is not a
// directory (a file, or a whiteout: a 0/0 character device hiding what is below) or at an opaque
// directory; otherwise directories merge. So, for each entry of src:
//   - not a directory (whiteouts included): it replaces whatever dst has, and stays a whiteout if
//     it is one, for the layers below dst;
//   - an opaque directory: it replaces dst's entry;
//   - a directory over a directory: they merge, with src's attributes, and dst's entry stays
//     opaque if it was;
//   - a directory over a file or a whiteout: it hides what is below, so it becomes opaque.
//
// Files are hard links to src's: layers below the top are never written, so sharing inodes is safe
// and a merge costs O(entries), not O(bytes).
func applyLayer(src, dst string) error {
	if err := applyDir(src, dst); err != nil {
		return err
	}
	return copyDirMeta(src, dst, isOpaque(dst))
}

func applyDir(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		s, d := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if !e.IsDir() {
			if err := os.RemoveAll(d); err != nil {
				return err
			}
			if err := os.Link(s, d); err != nil {
				return err
			}
			continue
		}
		if err := refuseRedirect(s); err != nil {
			return err
		}
		opaque := isOpaque(s)
		st, err := os.Lstat(d)
		switch {
		case err == nil && st.IsDir() && !opaque:
			opaque = isOpaque(d)
		case err == nil:
			opaque = true // over a file, a whiteout or a replaced directory: hides all below
			if err := os.RemoveAll(d); err != nil {
				return err
			}
			fallthrough
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(d, 0o700); err != nil {
				return err
			}
		default:
			return err
		}
		if err := applyDir(s, d); err != nil {
			return err
		}
		// Last, so that the entries just linked in do not change the times it copies.
		if err := copyDirMeta(s, d, opaque); err != nil {
			return err
		}
	}
	return nil
}

// copyDirMeta gives dst the mode, owner, xattrs (but overlayfs's own) and times of the directory
// src, and marks it opaque if asked.
func copyDirMeta(src, dst string, opaque bool) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: src, Err: err}
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	// chmod after chown: chown clears the setgid bit.
	if err := unix.Chmod(dst, st.Mode&07777); err != nil {
		return &os.PathError{Op: "chmod", Path: dst, Err: err}
	}
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		if isOverlayXattr(name) {
			continue
		}
		value, err := getXattr(src, name)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, name, value, 0); err != nil {
			return &os.PathError{Op: "setxattr " + name, Path: dst, Err: err}
		}
	}
	// dst is a directory a merge made, so only this sets overlay xattrs on it.
	if opaque {
		if err := unix.Lsetxattr(dst, opaqueXattr(src), []byte("y"), 0); err != nil {
			return &os.PathError{Op: "setxattr opaque", Path: dst, Err: err}
		}
	}
	times := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, times, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: dst, Err: err}
	}
	return nil
}

// opaqueXattr is the name under which dir's layer marks opaque directories.
func opaqueXattr(dir string) string {
	if _, err := getXattr(dir, "user.overlay.opaque"); err == nil {
		return "user.overlay.opaque"
	}
	return "trusted.overlay.opaque"
}

func isOpaque(dir string) bool {
	for _, name := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if v, err := getXattr(dir, name); err == nil && string(v) == "y" {
			return true
		}
	}
	return false
}

// refuseRedirect fails on a directory that overlayfs renamed with redirect_dir: its contents live
// under another path of the lower layers, which a merge by path would get wrong.
func refuseRedirect(dir string) error {
	for _, prefix := range overlayXattrPrefixes {
		if _, err := getXattr(dir, prefix+"redirect"); err == nil {
			return fmt.Errorf("%s was renamed by overlayfs with redirect_dir, which cklite cannot merge: mount without redirect_dir", dir)
		}
	}
	return nil
}

func isOverlayXattr(name string) bool {
	for _, prefix := range overlayXattrPrefixes {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

func listXattrs(path string) ([]string, error) {
	size, err := unix.Llistxattr(path, nil)
	if err != nil || size == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			err = nil
		}
		return nil, err
	}
	buf := make([]byte, size)
	if size, err = unix.Llistxattr(path, buf); err != nil {
		return nil, &os.PathError{Op: "listxattr", Path: path, Err: err}
	}
	var names []string
	for _, name := range strings.Split(string(buf[:size]), "\x00") {
		if name != "" {
			names = append(names, name)
		}
	}
	return names, nil
}

func getXattr(path, name string) ([]byte, error) {
	size, err := unix.Lgetxattr(path, name, nil)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, size)
	size, err = unix.Lgetxattr(path, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:size], nil
}
