package pagechain

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Most of a dump's files besides its pages are small and the same from one checkpoint to the
// next (namespaces, seccomp, file descriptors, tmpfs tars of /dev, the processes' fs and ids):
// about 20 of 40 in a busy shell's dump. Each costs a filesystem block (4 KiB) however small, so
// that they weighed half as much as the pages that changed (15 MiB of 60 in the benchmark's tree
// search; 6 MiB with share). share makes each image equal to one of the parent's, byte for byte,
// with the same mode and owner, a hard link to the parent's: the chain keeps one copy. It is safe
// because nothing writes an image in place: CRIU writes a dump once, and every rewrite here
// replaces a file by renaming a new one over it, which leaves the other links as they were.
// Removing the parent removes only its names; the child's link keeps the data.

// share replaces each file of dir equal to a file of parent by a hard link to it. A link that
// the filesystem refuses (another filesystem, too many links) leaves that file as it is. Each
// replacement is a rename of the new link over the file, so that a kill leaves either; what it
// leaves over (a temporary link) goes at the next sweep. The caller holds dir's exclusive lock
// and parent's shared one.
func share(dir, parent string) (Shared, error) {
	inParent, err := shareableFiles(parent)
	if err != nil {
		return Shared{}, err
	}
	bySize := map[int64][]fileAt{}
	for _, f := range inParent {
		bySize[f.info.Size()] = append(bySize[f.info.Size()], f)
	}
	files, err := shareableFiles(dir)
	if err != nil {
		return Shared{}, err
	}
	var s Shared
	for _, f := range files {
		if f.info.Size() == 0 {
			continue // takes no block
		}
		from, err := sameFile(f.path, f.info, bySize[f.info.Size()])
		if err != nil {
			return s, err
		}
		if from == "" {
			continue
		}
		linked, err := linkOver(from, f.path)
		if err != nil {
			return s, err
		}
		if linked {
			s.SharedFiles++
			s.SharedBytes += f.info.Size()
		}
	}
	if s.SharedFiles == 0 {
		return s, nil
	}
	return s, syncDir(dir)
}

// shareableFiles are the files of image directory dir that may become links, with their stat:
// CRIU's images (*.img), not temporary files. Nothing else: CRIU's logs and stats, which a
// restore without a work directory writes into the image directory, may be truncated and
// rewritten in place; cklite's JSON files say what this directory is.
func shareableFiles(dir string) ([]fileAt, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []fileAt
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), ".img") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		out = append(out, fileAt{path: filepath.Join(dir, e.Name()), info: fi})
	}
	return out, nil
}

type fileAt struct {
	path string
	info os.FileInfo
}

// sameFile is the candidate whose mode, owner and bytes are path's (stat fi), preferring the one
// of the same name; "" when none is, or path is a link to it already.
func sameFile(path string, fi os.FileInfo, candidates []fileAt) (string, error) {
	st := fi.Sys().(*syscall.Stat_t)
	name := filepath.Base(path)
	// The file of the same name first: it is the one most often equal.
	for pass := range 2 {
		for _, c := range candidates {
			if (filepath.Base(c.path) == name) != (pass == 0) {
				continue
			}
			cst := c.info.Sys().(*syscall.Stat_t)
			if cst.Dev == st.Dev && cst.Ino == st.Ino {
				return "", nil
			}
			if c.info.Mode() != fi.Mode() || cst.Uid != st.Uid || cst.Gid != st.Gid || cst.Dev != st.Dev {
				continue
			}
			eq, err := equalFiles(path, c.path)
			if err != nil || eq {
				return c.path, err
			}
		}
	}
	return "", nil
}

// equalFiles compares two files of the same size byte for byte.
func equalFiles(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, erra := io.ReadFull(fa, ba)
		nb, errb := io.ReadFull(fb, bb)
		if !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		done := errors.Is(erra, io.EOF) || errors.Is(erra, io.ErrUnexpectedEOF)
		if erra != nil && !done {
			return false, erra
		}
		if errb != nil && !errors.Is(errb, io.EOF) && !errors.Is(errb, io.ErrUnexpectedEOF) {
			return false, errb
		}
		if done {
			return true, nil
		}
	}
}

// linkOver replaces path by a hard link to from: a link made aside, then renamed over path. It
// returns false when the filesystem refuses the link (another filesystem, too many links, a
// filesystem without hard links).
func linkOver(from, path string) (bool, error) {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".link.tmp")
	os.Remove(tmp)
	if err := os.Link(from, tmp); err != nil {
		if errors.Is(err, syscall.EXDEV) || errors.Is(err, syscall.EMLINK) || errors.Is(err, syscall.EPERM) {
			return false, nil
		}
		return false, fmt.Errorf("link %s: %w", from, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return false, err
	}
	return true, nil
}
