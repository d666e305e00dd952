package podckpt

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Stats says what Copy copied and how.
type Stats struct {
	Files   int   `json:"files"`
	Bytes   int64 `json:"bytes"`
	Cloned  int   `json:"cloned"` // files that were reflinks (FICLONE), not copies
	TookNs  int64 `json:"tookNs"`
	Entries int   `json:"entries"` // files, directories, links
}

// Copy copies the tree at src into dst, which must not exist (its parent is made): directories, regular files (a
// reflink where the file system has them, an in-kernel copy otherwise), symbolic links and
// FIFOs, with their modes and owners. Sockets and devices are refused: a checkpoint could not
// give them back. Hard links inside src become separate files.
func Copy(src, dst string) (Stats, error) {
	var st Stats
	start := time.Now()
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return st, fmt.Errorf("copy volume %s: %w", src, err)
	}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		st.Entries++
		return copyEntry(path, filepath.Join(dst, rel), d, &st)
	})
	st.TookNs = time.Since(start).Nanoseconds()
	if err != nil {
		return st, fmt.Errorf("copy volume %s: %w", src, err)
	}
	return st, nil
}

// copyEntry copies one entry of Copy's walk.
func copyEntry(from, to string, d fs.DirEntry, st *Stats) error {
	info, err := d.Info()
	if err != nil {
		return err
	}
	mode := info.Mode()
	switch {
	case mode.IsDir():
		if err := os.Mkdir(to, mode.Perm()); err != nil {
			return err
		}
	case mode.IsRegular():
		cloned, err := copyFile(from, to, mode.Perm())
		if err != nil {
			return err
		}
		st.Files++
		st.Bytes += info.Size()
		if cloned {
			st.Cloned++
		}
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(from)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, to); err != nil {
			return err
		}
	case mode&fs.ModeNamedPipe != 0:
		if err := unix.Mkfifo(to, uint32(mode.Perm())); err != nil {
			return fmt.Errorf("mkfifo %s: %w", to, err)
		}
	default:
		return fmt.Errorf("%s is a %v, which a pod checkpoint cannot copy", from, mode.Type())
	}
	return keepOwner(info, to, mode)
}

// keepOwner gives to the owner and mode bits (setuid, sticky) of the entry info describes.
func keepOwner(info fs.FileInfo, to string, mode fs.FileMode) error {
	if sys, ok := info.Sys().(*syscall.Stat_t); ok {
		if err := os.Lchown(to, int(sys.Uid), int(sys.Gid)); err != nil {
			return err
		}
	}
	if mode&fs.ModeSymlink != 0 {
		return nil
	}
	// Mkdir, OpenFile and Mkfifo applied the umask, and chown cleared setuid and setgid.
	return os.Chmod(to, mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
}

// copyFile copies regular file from into the new file to: a reflink if the file system can
// (cloned), otherwise copy_file_range through io.Copy, in the kernel.
func copyFile(from, to string, perm fs.FileMode) (cloned bool, err error) {
	in, err := os.Open(from)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return false, err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err == nil {
		return true, nil
	} else if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return false, fmt.Errorf("reflink %s: %w", from, err)
	}
	_, err = io.Copy(out, in)
	return false, err
}

// Replace makes dir hold exactly what the copy at from holds: its entries are removed and the
// copy's copied in. dir itself stays (containers bind-mount it: a new directory would not be
// what they see).
func Replace(dir, from string) (Stats, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Stats{}, fmt.Errorf("volume %s: %w", dir, err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return Stats{}, fmt.Errorf("empty volume %s: %w", dir, err)
		}
	}
	var st Stats
	top, err := os.ReadDir(from)
	if err != nil {
		return st, fmt.Errorf("volume copy %s: %w", from, err)
	}
	for _, e := range top {
		s, err := Copy(filepath.Join(from, e.Name()), filepath.Join(dir, e.Name()))
		st.add(s)
		st.TookNs += s.TookNs
		if err != nil {
			return st, err
		}
	}
	return st, nil
}

func (s *Stats) add(o Stats) {
	s.Files += o.Files
	s.Bytes += o.Bytes
	s.Cloned += o.Cloned
	s.Entries += o.Entries
}
