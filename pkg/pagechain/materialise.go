package pagechain

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/criuimage"
)

// Restore is an image directory's chain held read-locked while CRIU restores from it, and the
// directory CRIU is to read.
//
// CRIU reads plain pages files only. When no directory of the chain holds a compressed one, CRIU
// reads the image directory itself. Otherwise the chain is materialised, down to its last
// directory that holds a compressed pages file: a directory per level, in a new directory below
// the restore's work directory, whose files are symbolic links to the stored ones but for the
// compressed pages files, which are decompressed there, and whose parent link names the next
// level's copy (the last copy's names the stored directory above it). Only the compressed pages
// (small: CompressMax) are written; the rest, a chain's large first dump included, is read
// where it is stored. The copy is made in a tmpfs where there is one (shm). Each restore materialises its own copy and Close removes it: a fork of
// the same checkpoint pays the decompression again, which costs less than keeping a cache
// bounded and clean (docs/checkpoints.md).
type Restore struct {
	*Locked
	// Dir is the directory CRIU reads: the image directory, or its materialised copy.
	Dir string
	tmp string
}

// OpenRestore read-locks the chain of image directory dir and materialises it, if it has to be,
// in shm when that is a tmpfs, else below work (the system's temporary directory when "").
func OpenRestore(dir, work string) (*Restore, error) {
	l, err := ReadLock(dir)
	if err != nil {
		return nil, err
	}
	r := &Restore{Locked: l, Dir: dir}
	if err := r.materialise(work); err != nil {
		r.Close()
		return nil, fmt.Errorf("materialise image directory %s: %w", dir, err)
	}
	return r, nil
}

// Close removes the materialised copy and unlocks the chain.
func (r *Restore) Close() {
	if r.tmp != "" {
		os.RemoveAll(r.tmp)
	}
	r.Locked.Unlock()
}

// shm is where chains are materialised when it is a tmpfs: a symbolic link costs 150-200 µs on
// the disk's filesystem here, and a materialised chain of 9 levels had 360 of them (65 ms a
// restore); on a tmpfs, and with parent levels linking only what CRIU reads there, a few ms.
var shm = "/dev/shm"

// scratch is the directory to materialise in: shm when it is a tmpfs, else work.
func scratch(work string) string {
	var st unix.Statfs_t
	if shm != "" && unix.Statfs(shm, &st) == nil && st.Type == unix.TMPFS_MAGIC {
		return shm
	}
	return work
}

func (r *Restore) materialise(work string) error {
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
	var err error
	if r.tmp, err = os.MkdirTemp(scratch(work), ".cklite-images-"); err != nil {
		return err
	}
	if r.tmp, err = filepath.Abs(r.tmp); err != nil {
		return err
	}
	for i := 0; i <= last; i++ {
		parent := filepath.Join(r.tmp, strconv.Itoa(i+1))
		if i == last {
			parent = ""
			if i+1 < len(r.Dirs) {
				if parent, err = filepath.Abs(r.Dirs[i+1]); err != nil {
					return err
				}
			}
		}
		if err := materialiseDir(r.Dirs[i], filepath.Join(r.tmp, strconv.Itoa(i)), parent, i == 0); err != nil {
			return err
		}
	}
	r.Dir = filepath.Join(r.tmp, "0")
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

// materialiseDir makes dst a copy of image directory src for CRIU to read, with parent (absolute,
// "" for none) as its parent link. CRIU's own output (its logs and stats, which a restore writes
// into the image directory) is not linked, so that it lands in the copy; nor are hidden files.
// Below the top (the directory restored), CRIU reads only pagemaps and pages files (and the
// inventory): nothing else is linked there.
func materialiseDir(src, dst, parent string, top bool) error {
	src, err := filepath.Abs(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		if n == criuimage.ParentLink || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "stats-") || strings.HasSuffix(n, ".log") {
			continue
		}
		if !top && !strings.HasPrefix(n, "pagemap-") && !strings.HasPrefix(n, "pages-") && n != "inventory.img" {
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
