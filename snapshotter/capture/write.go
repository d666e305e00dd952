package capture

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// writer writes a plan's ops from the live upper into the upper of the capture's snapshot.
type writer struct {
	from, to string
	made     map[string]bool   // directories made in the capture
	dirs     []string          // the same, in order: their times are set last
	links    map[uint64]string // inode of a file with several links → its first path written
}

func newWriter(from, to string) *writer {
	return &writer{from: from, to: to, made: map[string]bool{".": true}, dirs: []string{"."}, links: map[uint64]string{}}
}

// apply writes ops, then gives every directory it made its times (writing below a directory
// changes them).
func (w *writer) apply(ops []op) error {
	// The merged view takes its root's owner, mode and times from the top layer's root.
	if err := w.meta(".", ""); err != nil {
		return err
	}
	for _, o := range ops {
		if err := w.parents(o.path); err != nil {
			return err
		}
		if err := w.op(o); err != nil {
			return err
		}
	}
	for i := len(w.dirs) - 1; i >= 0; i-- {
		st, err := lstat(filepath.Join(w.from, w.dirs[i]))
		if err != nil {
			return err
		}
		if err := setTimes(filepath.Join(w.to, w.dirs[i]), st); err != nil {
			return err
		}
	}
	return nil
}

func (w *writer) op(o op) error {
	dst := filepath.Join(w.to, o.path)
	if o.whiteout {
		if err := unix.Mknod(dst, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("whiteout %s: %w", o.path, err)
		}
		return nil
	}
	src := filepath.Join(w.from, o.path)
	st, err := lstat(src)
	if err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if w.made[o.path] {
			return nil
		}
		return w.mkdir(o.path, o.opaque)
	case unix.S_IFREG:
		linked, err := w.copyFile(o.path, st)
		if err != nil || linked {
			return err
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err == nil {
			err = os.Symlink(target, dst)
		}
		if err != nil {
			return fmt.Errorf("symlink %s: %w", o.path, err)
		}
	default: // devices, fifos, sockets, and the upper's own whiteouts
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod %s: %w", o.path, err)
		}
	}
	if err := w.meta(o.path, ""); err != nil {
		return err
	}
	return setTimes(dst, st)
}

// parents makes the directories above rel that the capture does not have yet, with the live
// upper's attributes (the merged view takes a directory's from its top layer) and without an
// opaque mark: the previous capture's entries below them still show.
func (w *writer) parents(rel string) error {
	dir := filepath.Dir(rel)
	if w.made[dir] {
		return nil
	}
	if err := w.parents(dir); err != nil {
		return err
	}
	return w.mkdir(dir, "")
}

func (w *writer) mkdir(rel, opaque string) error {
	if err := os.Mkdir(filepath.Join(w.to, rel), 0o700); err != nil {
		return fmt.Errorf("mkdir %s: %w", rel, err)
	}
	w.made[rel] = true
	w.dirs = append(w.dirs, rel)
	return w.meta(rel, opaque)
}

// copyFile copies regular file rel, or links it to the path it was already copied to; linked
// says which (a link has its metadata already).
func (w *writer) copyFile(rel string, st *unix.Stat_t) (linked bool, err error) {
	dst := filepath.Join(w.to, rel)
	if st.Nlink > 1 {
		if first, ok := w.links[st.Ino]; ok {
			if err := os.Link(filepath.Join(w.to, first), dst); err != nil {
				return false, fmt.Errorf("link %s: %w", rel, err)
			}
			return true, nil
		}
		w.links[st.Ino] = rel
	}
	in, err := os.Open(filepath.Join(w.from, rel))
	if err != nil {
		return false, fmt.Errorf("copy %s: %w", rel, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false, fmt.Errorf("copy %s: %w", rel, err)
	}
	// Between two files io.Copy is copy_file_range: in the kernel, a reflink where the
	// filesystem has them.
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("copy %s: %w", rel, err)
	}
	return false, nil
}

// meta gives rel in the capture the live entry's owner, mode and extended attributes (in that
// order: a chown drops set-id bits and file capabilities), the opaque mark excepted: opaque, if
// not "", is the mark to set.
func (w *writer) meta(rel, opaque string) error {
	src, dst := filepath.Join(w.from, rel), filepath.Join(w.to, rel)
	st, err := lstat(src)
	if err != nil {
		return err
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return fmt.Errorf("chmod %s: %w", rel, err)
		}
	}
	if err := copyXattrs(src, dst); err != nil {
		return fmt.Errorf("extended attributes of %s: %w", rel, err)
	}
	if opaque != "" {
		if err := unix.Lsetxattr(dst, opaqueXattr, []byte(opaque), 0); err != nil {
			return fmt.Errorf("mark %s opaque: %w", rel, err)
		}
	}
	return nil
}

// upperOnlyXattrs are overlayfs's own attributes that it reads on an upper directory only: the
// lower entry an entry was copied up from (origin, for constant inode numbers) and the mark of a
// directory holding copied-up entries (impure, for readdir's inode numbers). A capture is only
// ever a lower layer, where they mean nothing, and a directory carrying both takes a 4 KiB
// block for them outside its inode: a third of a typical capture's disk (the benchmark's tree
// search: 13 directories and 12 small files a checkpoint; 16 -> 12 MiB over 101 captures).
var upperOnlyXattrs = map[string]bool{"trusted.overlay.origin": true, "trusted.overlay.impure": true}

// copyXattrs copies src's extended attributes to dst, but the opaque mark and upperOnlyXattrs.
func copyXattrs(src, dst string) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		if name == opaqueXattr || upperOnlyXattrs[name] {
			continue
		}
		v, err := getXattr(src, name)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, name, v, 0); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}

func listXattrs(path string) ([]string, error) {
	buf, err := grow(func(b []byte) (int, error) { return unix.Llistxattr(path, b) })
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	var names []string
	for len(buf) > 0 {
		i := 0
		for i < len(buf) && buf[i] != 0 {
			i++
		}
		if i > 0 {
			names = append(names, string(buf[:i]))
		}
		buf = buf[min(i+1, len(buf)):]
	}
	return names, nil
}

func getXattr(path, name string) ([]byte, error) {
	v, err := grow(func(b []byte) (int, error) { return unix.Lgetxattr(path, name, b) })
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", name, err)
	}
	return v, nil
}

// grow calls read with a buffer large enough for what it reads (the size may change between a
// sizing call and the read: ERANGE, then again).
func grow(read func([]byte) (int, error)) ([]byte, error) {
	for {
		n, err := read(nil)
		if err != nil || n == 0 {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = read(buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		return buf[:n], err
	}
}

func lstat(path string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	return &st, nil
}

func setTimes(path string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("times of %s: %w", path, err)
	}
	return nil
}
