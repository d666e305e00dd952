package pagechain

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/criuimage"
	"github.com/cklite/cklite/pkg/fault"
)

// Result is what a rewrite of an image directory did.
type Result struct {
	Counts
	// Processes is how many processes' pagemaps were rewritten.
	Processes int `json:"processes"`
	// BytesBefore and BytesAfter are the sizes of the directory's pages files.
	BytesBefore int64 `json:"bytesBefore"`
	BytesAfter  int64 `json:"bytesAfter"`
	Shared
}

// Shared is what Dedup did besides the pages: the directory's files made hard links to the
// parent's equal ones (share.go), and their bytes.
type Shared struct {
	SharedFiles int   `json:"sharedFiles,omitempty"`
	SharedBytes int64 `json:"sharedBytes,omitempty"`
}

// ErrChainTooLong is returned by Dedup when the parent's chain is at its longest already: the
// directory then stays whole, and starts a new chain.
var ErrChainTooLong = errors.New("parent chain at its longest")

// Dedup rewrites the image directory dir, a complete CRIU dump, so that every page equal to the
// page its parent image directory parent holds at the same address, for the same process, is read
// from there, and makes dir's parent link. Processes the parent has no pagemap for stay whole.
// Then every other file of dir equal to one of parent's becomes a hard link to it (share). A
// directory that has another parent already is left alone.
func Dedup(dir, parent string) (Result, error) {
	var err error
	if dir, err = filepath.Abs(dir); err != nil {
		return Result{}, err
	}
	if parent, err = filepath.Abs(parent); err != nil {
		return Result{}, err
	}
	l, err := writeLock(dir)
	if err != nil {
		return Result{}, err
	}
	defer l.Unlock()
	if len(l.Dirs) > 1 && l.Dirs[1] != parent {
		return Result{}, nil
	}
	// With the link to parent already there, a killed Dedup is finished: the processes it had
	// not swapped yet are done now, and its leftovers swept.
	pl, err := ReadLock(parent)
	if err != nil {
		return Result{}, err
	}
	defer pl.Unlock()
	if removing(parent) {
		return Result{}, fmt.Errorf("image directory %s: %w", parent, ErrParentRemoved)
	}
	if len(pl.Dirs) >= criuimage.MaxChain {
		return Result{}, fmt.Errorf("image directory %s: %w (%d)", parent, ErrChainTooLong, len(pl.Dirs))
	}
	rel, err := filepath.Rel(dir, parent)
	if err != nil {
		return Result{}, err
	}
	res, err := rewriteDir(dir, append([]string{dir}, pl.Dirs...), dedup, func() error {
		return replaceLink(dir, rel)
	}, nil)
	if err != nil {
		return res, err
	}
	res.Shared, err = share(dir, parent)
	return res, err
}

// Detach makes the image directory dir independent of its parent P, so that P can be removed: the
// pages dir reads from P are copied into dir, and dir's parent becomes P's parent (dir reads the
// pages above P from there, as it did through P). Without a parent, nothing is done.
func Detach(dir string) (Result, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return Result{}, err
	}
	l, err := writeLock(dir)
	if err != nil {
		return Result{}, err
	}
	defer l.Unlock()
	if len(l.Dirs) == 1 {
		return Result{}, nil
	}
	if len(l.Dirs) == 2 {
		return rewriteDir(dir, l.Dirs, flatten, nil, func() error { return removeLink(dir) })
	}
	rel, err := filepath.Rel(dir, l.Dirs[2])
	if err != nil {
		return Result{}, err
	}
	// The new pagemaps read the pages above P from P's parent; through P (the link as it is until
	// the swap) they read the very same pages, so every step leaves a restorable directory.
	return rewriteDir(dir, l.Dirs, detach, nil, func() error { return replaceLink(dir, rel) })
}

// rewriteDir rewrites the pagemap and pages file of every process of dirs[0] (m), then swaps them
// in. before runs before the first swap, after after the last. A kill at any point leaves dirs[0]
// restorable: each new pages file is complete before the renamed pagemap points to it, and the old
// pages file is removed only after; what a kill leaves over (temporary files, a pages file no
// pagemap names) goes at the next rewrite (sweep).
func rewriteDir(dir string, dirs []string, m mode, before, after func() error) (Result, error) {
	if err := sweep(dir); err != nil {
		return Result{}, err
	}
	pids, err := criuimage.PagemapPids(dir)
	if err != nil {
		return Result{}, err
	}
	nextID, err := nextPagesID(dir)
	if err != nil {
		return Result{}, err
	}
	var res Result
	var done []swap
	defer func() {
		for _, s := range done {
			os.Remove(s.tmpPages)
		}
	}()
	for _, pid := range pids {
		s, n, err := rewriteProcess(dir, dirs, pid, m, nextID)
		if err != nil {
			return Result{}, err
		}
		if s == nil {
			continue
		}
		done = append(done, *s)
		res.Counts.add(n)
		res.Processes++
		res.BytesBefore += s.oldSize
		res.BytesAfter += int64(n.Present * pageSize)
		nextID++
	}
	if len(done) == 0 && m == dedup {
		return res, nil
	}
	if before != nil {
		if err := before(); err != nil {
			return Result{}, err
		}
	}
	for _, s := range done {
		if err := s.commit(dir); err != nil {
			return Result{}, err
		}
	}
	if after != nil {
		if err := after(); err != nil {
			return Result{}, err
		}
	}
	return res, syncDir(dir)
}

// swap is one process's rewritten pagemap and pages file, written to temporary files in dir.
type swap struct {
	pid                uint32
	pagemap            criuimage.PagemapFile
	tmpPages, oldPages string
	oldSize            int64
}

// rewriteProcess writes process pid's new pages file (as a temporary file) and returns its swap,
// or nil when m changes nothing (deduplication found no page in the parent).
func rewriteProcess(dir string, dirs []string, pid uint32, m mode, id uint32) (*swap, Counts, error) {
	src, err := openSource(dirs, pid)
	if err != nil {
		return nil, Counts{}, err
	}
	defer src.close()
	if len(src.levels) == 0 || (m == dedup && len(src.levels) == 1) {
		return nil, Counts{}, nil
	}
	top := src.levels[0]
	if (m != dedup) != hasInParent(top.pm.Runs) {
		return nil, Counts{}, nil // nothing in parents to copy in, or deduplicated already
	}
	s := &swap{pid: pid, oldPages: top.file, oldSize: top.stored, tmpPages: filepath.Join(dir, "."+criuimage.PagesName(id)+".tmp")}
	f, err := os.OpenFile(s.tmpPages, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, Counts{}, err
	}
	runs, n, err := rewriteFile(src, m, f)
	if err != nil {
		os.Remove(s.tmpPages)
		return nil, Counts{}, fmt.Errorf("rewrite pages of process %d in %s: %w", pid, dir, err)
	}
	if m == dedup && n.InParent == 0 {
		os.Remove(s.tmpPages)
		return nil, Counts{}, nil
	}
	s.pagemap = criuimage.PagemapFile{PagesID: id, Runs: runs}
	return s, n, nil
}

func hasInParent(runs []criuimage.PageRun) bool {
	for _, r := range runs {
		if r.InParent() {
			return true
		}
	}
	return false
}

// commit puts the new pages file in place, then the pagemap naming it, then removes the old pages
// file.
func (s swap) commit(dir string) error {
	if err := os.Rename(s.tmpPages, filepath.Join(dir, s.pagemap.PagesName())); err != nil {
		return err
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	fault.Point(fault.PagechainSwap)
	if err := writeFileSync(filepath.Join(dir, criuimage.PagemapName(s.pid)), s.pagemap.Encode()); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, s.oldPages)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// writeFileSync replaces path with data atomically: a temporary file, synced, renamed over it.
func writeFileSync(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := writeFileMode(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// replaceLink points dir's parent link at target (relative to dir), atomically.
func replaceLink(dir, target string) error {
	tmp := filepath.Join(dir, "."+criuimage.ParentLink+".tmp")
	os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, criuimage.ParentLink)); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

func removeLink(dir string) error {
	if err := os.Remove(filepath.Join(dir, criuimage.ParentLink)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// sweep removes what a killed rewrite or compression left in dir: its temporary files, pages
// files no pagemap names, and the plain form of a pages file compressed already. The caller
// holds dir's exclusive lock.
func sweep(dir string) error {
	named, err := criuimage.PagesFiles(dir)
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		stale := strings.HasPrefix(n, ".") && strings.HasSuffix(n, ".tmp")
		if id, ok := pagesID(n); ok && named[criuimage.PagesName(id)] == "" {
			stale = true
		}
		// Both forms of a pages file: a compression killed before it removed the plain one.
		if plain, ok := strings.CutSuffix(n, criuimage.CompressedSuffix); ok && named[plain] != "" {
			if _, err := os.Stat(filepath.Join(dir, plain)); err == nil {
				n = plain
				stale = true
			}
		}
		if stale {
			if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// pagesID is the id of pages file name, plain or compressed.
func pagesID(name string) (uint32, bool) {
	name = strings.TrimSuffix(name, criuimage.CompressedSuffix)
	s, ok := strings.CutPrefix(name, "pages-")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".img")
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseUint(s, 10, 32)
	return uint32(id), err == nil && criuimage.PagesName(uint32(id)) == name
}

// nextPagesID is an id above every pages file's of dir: a rewritten pages file gets a new name,
// so that the old pagemap keeps naming the old file until the new pagemap is in place.
func nextPagesID(dir string) (uint32, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var top uint32
	for _, e := range entries {
		if id, ok := pagesID(e.Name()); ok && id > top {
			top = id
		}
	}
	if top == ^uint32(0) {
		return 0, fmt.Errorf("image directory %s: no pages file id left: %w", dir, errdefs.ErrInvalidArgument)
	}
	return top + 1, nil
}
