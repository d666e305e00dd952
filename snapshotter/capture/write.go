package capture

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// writer writes a plan's ops from the live upper into the upper of the capture's snapshot. The
// task is frozen while it runs (beside CRIU's dump, on a loaded host): every entry costs a few
// system calls, a regular file's made on its descriptors (no path walk, no Go poller
// registration) and each entry's attributes read once.
type writer struct {
	from, to string
	made     map[string]bool   // directories made in the capture
	dirs     []madeDir         // the same, in order: their times are set last
	links    map[uint64]string // inode of a file with several links → its first path written
}

// madeDir is a directory made in the capture, with the live one's attributes.
type madeDir struct {
	rel string
	st  *unix.Stat_t
}

func newWriter(from, to string) *writer {
	return &writer{from: from, to: to, made: map[string]bool{".": true}, links: map[uint64]string{}}
}

// apply writes ops, then gives every directory it made its times (writing below a directory
// changes them).
func (w *writer) apply(ops []op) error {
	// The merged view takes its root's owner, mode and times from the top layer's root.
	st, err := lstat(w.from)
	if err != nil {
		return err
	}
	w.dirs = append(w.dirs, madeDir{".", st})
	if err := w.meta(".", st, ""); err != nil {
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
		if err := setTimes(filepath.Join(w.to, w.dirs[i].rel), w.dirs[i].st); err != nil {
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
		return w.mkdir(o.path, st, o.opaque)
	case unix.S_IFREG:
		return w.copyFile(o.path, st)
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
	if err := w.meta(o.path, st, ""); err != nil {
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
	st, err := lstat(filepath.Join(w.from, dir))
	if err != nil {
		return err
	}
	return w.mkdir(dir, st, "")
}

// mkdir makes directory rel, whose live attributes are st.
func (w *writer) mkdir(rel string, st *unix.Stat_t, opaque string) error {
	if err := os.Mkdir(filepath.Join(w.to, rel), 0o700); err != nil {
		return fmt.Errorf("mkdir %s: %w", rel, err)
	}
	w.made[rel] = true
	w.dirs = append(w.dirs, madeDir{rel, st})
	return w.meta(rel, st, opaque)
}

// copyFile copies regular file rel, whose live attributes are st, with them, or links it to the
// path it was already copied to.
func (w *writer) copyFile(rel string, st *unix.Stat_t) error {
	dst := filepath.Join(w.to, rel)
	if st.Nlink > 1 {
		if first, ok := w.links[st.Ino]; ok {
			if err := os.Link(filepath.Join(w.to, first), dst); err != nil {
				return fmt.Errorf("link %s: %w", rel, err)
			}
			return nil
		}
		w.links[st.Ino] = rel
	}
	in, err := unix.Open(filepath.Join(w.from, rel), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	defer unix.Close(in)
	out, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	err = copyData(in, out, st.Size)
	if err == nil {
		err = fileMeta(in, out, st)
	}
	if cerr := unix.Close(out); err == nil {
		err = cerr
	}
	if err == nil {
		err = setTimes(dst, st)
	}
	if err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	return nil
}

// copyData copies the size bytes of file in (still: its writers are frozen) to out: with
// copy_file_range, in the kernel and a reflink where the filesystem has them, else (another
// filesystem, one without it) by reading and writing.
func copyData(in, out int, size int64) error {
	var done int64
	for done < size {
		n, err := unix.CopyFileRange(in, nil, out, nil, int(min(size-done, 1<<30)), 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case done == 0 && (errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP)):
			return readWrite(in, out)
		case err != nil:
			return err
		case n == 0:
			return nil // shorter than it was: the copy has what there is
		}
		done += int64(n)
	}
	return nil
}

// readWrite copies file in to out through a buffer.
func readWrite(in, out int) error {
	buf := make([]byte, 128<<10)
	for {
		n, err := unix.Read(in, buf)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case n == 0:
			return nil
		}
		for b := buf[:n]; len(b) > 0; {
			m, err := unix.Write(out, b)
			if err != nil && !errors.Is(err, unix.EINTR) {
				return err
			}
			b = b[max(m, 0):]
		}
	}
}

// fileMeta gives the copy out of a regular file the owner, mode and extended attributes of in,
// whose attributes are st (in that order: a chown drops set-id bits and file capabilities).
func fileMeta(in, out int, st *unix.Stat_t) error {
	if err := unix.Fchown(out, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(out, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	names, err := grow(func(b []byte) (int, error) { return unix.Flistxattr(in, b) })
	if err != nil {
		return fmt.Errorf("extended attributes: list: %w", err)
	}
	for _, name := range xattrNames(names) {
		if name == opaqueXattr || upperOnlyXattrs[name] {
			continue
		}
		v, err := grow(func(b []byte) (int, error) { return unix.Fgetxattr(in, name, b) })
		if err != nil {
			return fmt.Errorf("extended attributes: get %s: %w", name, err)
		}
		if err := unix.Fsetxattr(out, name, v, 0); err != nil {
			return fmt.Errorf("extended attributes: set %s: %w", name, err)
		}
	}
	return nil
}

// meta gives rel in the capture the live entry's owner, mode and extended attributes, st its
// attributes (in that order: a chown drops set-id bits and file capabilities), the opaque mark
// excepted: opaque, if not "", is the mark to set.
func (w *writer) meta(rel string, st *unix.Stat_t, opaque string) error {
	src, dst := filepath.Join(w.from, rel), filepath.Join(w.to, rel)
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
	return xattrNames(buf), nil
}

// xattrNames splits a list of extended attributes' names as listxattr returns it.
func xattrNames(buf []byte) []string {
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
	return names
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
