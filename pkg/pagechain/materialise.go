package pagechain

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/criuimage"
)

// Restore is an image directory's chain held read-locked while CRIU restores from it, and the
// directory CRIU is to read.
//
// CRIU reads plain pages files only. When no directory of the chain holds a compressed one, CRIU
// reads the image directory itself. Otherwise the chain is materialised, down to its last
// directory that holds a compressed pages file: each of these levels has a copy in the
// materialisation cache (cache.go), whose files are relative symbolic links to the stored ones
// but for the compressed pages files, which are decompressed there, and whose parent link names
// the next level's copy (the last copy's names the stored directory above it). Only compressed
// pages (small: CompressMax) are written; the rest, a chain's large first dump included, is read
// where it is stored. A copy is named by what it reads (cacheKey), so that restores and forks of
// checkpoints that share levels share their copies, in any process: a tree search's rollbacks
// decompress each level once. The restore holds each copy it reads locked (shared), so that
// eviction, which keeps the cache under cacheMax, leaves it alone.
type Restore struct {
	*Locked
	// Dir is the directory CRIU reads: the image directory, or its materialised copy.
	Dir    string
	copies []*os.File
}

// OpenRestore read-locks the chain of image directory dir and materialises it if it has to be.
func OpenRestore(dir string) (*Restore, error) {
	l, err := ReadLock(dir)
	if err != nil {
		return nil, err
	}
	r := &Restore{Locked: l, Dir: dir}
	if err := r.materialise(); err != nil {
		r.Close()
		return nil, fmt.Errorf("materialise image directory %s: %w", dir, err)
	}
	return r, nil
}

// Materialise makes the copies a restore of image directory dir reads, ahead of the restore: the
// shim calls it once a checkpoint's pages are compressed, in the background, so that a rollback
// to the checkpoint finds its copy made (a level's copy took 2-9 ms to make on the rolled-back
// task's path, 0.3-0.8 ms to reuse). The copies are then the cache's like any other: evicted
// when unused for cacheIdle or past cacheMax.
func Materialise(dir string) error {
	r, err := OpenRestore(dir)
	if err != nil {
		return err
	}
	r.Close()
	return nil
}

// Close releases the copies and unlocks the chain.
func (r *Restore) Close() {
	for _, f := range r.copies {
		f.Close()
	}
	r.copies = nil
	r.Locked.Unlock()
}

func (r *Restore) materialise() error {
	last := -1
	for i, d := range r.Dirs {
		c, err := hasCompressed(d)
		if err != nil {
			return err
		}
		if c {
			last = i
		}
	}
	if last < 0 {
		return nil
	}
	root, err := cacheDir()
	if err != nil {
		return err
	}
	// The root-most copy first: each copy's parent link names the copy above it.
	parent := ""
	if last+1 < len(r.Dirs) {
		if parent, err = filepath.Abs(r.Dirs[last+1]); err != nil {
			return err
		}
	}
	built := false
	for i := last; i >= 0; i-- {
		src, err := filepath.Abs(r.Dirs[i])
		if err != nil {
			return err
		}
		name, err := cacheKey(src, parent)
		if err != nil {
			return err
		}
		f, made, err := useCopy(root, name, src, parent)
		if err != nil {
			return err
		}
		r.copies = append(r.copies, f)
		built = built || made
		parent = filepath.Join(root, name)
	}
	r.Dir = parent
	if built {
		// Off the restore's path (the task is down until CRIU has restored it): eviction skips
		// the copies this restore holds, and reads every copy's directory.
		go maybeEvict(root)
	}
	return nil
}

// hasCompressed reports whether image directory dir holds a compressed pages file.
func hasCompressed(dir string) (bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	for _, e := range entries {
		if _, ok := compressedPages(e.Name()); ok {
			return true, nil
		}
	}
	return false, nil
}

// compressedPages is the plain name of compressed pages file name.
func compressedPages(name string) (string, bool) {
	plain, ok := strings.CutSuffix(name, criuimage.CompressedSuffix)
	if !ok || strings.HasPrefix(name, ".") {
		return "", false
	}
	_, ok = pagesID(plain)
	return plain, ok
}

// copied says whether entry n of an image directory has a place in its copy: not the parent
// link (the copy has its own), hidden files, CRIU's output (logs and stats, which a restore
// without a work directory writes into the image directory), nor ReportFile, which CRIU does not
// read and the shim writes after the compression: the copy Materialise makes then is the one
// later restores look for (cacheKey).
func copied(n string) bool {
	return n != criuimage.ParentLink && n != ReportFile && !strings.HasPrefix(n, ".") && !strings.HasPrefix(n, "stats-") && !strings.HasSuffix(n, ".log")
}

// cacheKey names the copy of image directory src (absolute) whose parent link names parent: a
// hash of both and of each copied entry's name, inode and size. Every change of a stored image
// directory replaces a file by a new one (a rewrite, a compression, a new parent link), so a copy
// made before the change is never taken for one after it.
func cacheKey(src, parent string) (string, error) {
	entries, err := os.ReadDir(src)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", src, parent)
	for _, e := range entries {
		if !copied(e.Name()) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return "", err
		}
		st := fi.Sys().(*syscall.Stat_t)
		fmt.Fprintf(h, "%s\x00%d\x00%d\x00%d\x00", e.Name(), st.Dev, st.Ino, fi.Size())
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

// materialiseDir fills dst with the copy of image directory src, with parent (absolute, "" for
// none) as its parent link.
func materialiseDir(src, dst, parent string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		if !copied(n) {
			continue
		}
		if plain, ok := compressedPages(n); ok {
			if err := decompressInto(src, n, dst, plain); err != nil {
				return err
			}
			continue
		}
		if err := relLink(filepath.Join(src, n), dst, n); err != nil {
			return err
		}
	}
	if parent == "" {
		return nil
	}
	return relLink(parent, dst, criuimage.ParentLink)
}

// relLink makes dir/name a symbolic link to target, relative: CRIU reads the pages of a process
// from within its restored mount namespace, through the image directory's descriptor, where an
// absolute link would resolve in the container's root.
func relLink(target, dir, name string) error {
	rel, err := filepath.Rel(dir, target)
	if err != nil {
		return err
	}
	return os.Symlink(rel, filepath.Join(dir, name))
}

// decompressInto writes compressed pages file name of src, decompressed, as dst/plain, unless
// src holds the plain file too (a killed compression left both): then it is linked.
func decompressInto(src, name, dst, plain string) error {
	if _, err := os.Lstat(filepath.Join(src, plain)); err == nil {
		return nil // linked as the plain file it is
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	data, err := ReadCompressed(src, name)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dst, plain), data, 0o600)
}

// lockCopy opens copy dir and locks it (how, flock), or returns os.ErrNotExist when it is not
// there, or was removed by an eviction before the lock was taken.
func lockCopy(dir string, how int) (*os.File, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	if err := flock(f, how); err != nil {
		f.Close()
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Nlink == 0 {
		f.Close()
		return nil, os.ErrNotExist
	}
	return f, nil
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
