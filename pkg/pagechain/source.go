package pagechain

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/cklite/cklite/pkg/criuimage"
)

// pageSize is the size of the pages CRIU dumps: the host's.
var pageSize = uint64(os.Getpagesize())

// level is one image directory's pagemap of a process, with its pages file open.
type level struct {
	dir   string
	pm    criuimage.PagemapFile
	offs  []uint64 // byte offset of each present run in the pages file
	pages pagesReader
	// file is the name of the pages file on disk (pages-<id>.img, or compressed), stored its size.
	file   string
	stored int64
}

func openLevel(dir string, pid uint32) (*level, error) {
	pm, err := criuimage.ReadPagemap(filepath.Join(dir, criuimage.PagemapName(pid)))
	if err != nil {
		return nil, err
	}
	r, name, size, err := openPages(dir, pm.PagesName())
	if err != nil {
		return nil, err
	}
	l := &level{dir: dir, pm: pm, pages: r, file: name, stored: size, offs: make([]uint64, len(pm.Runs))}
	var off uint64
	for i, r := range pm.Runs {
		l.offs[i] = off
		if r.Present() {
			off += r.Pages * pageSize
		}
	}
	return l, nil
}

// source reads a process's pages through a chain of image directories, levels[0] first. A level
// without a pagemap for the process ends it, as it ends CRIU's.
type source struct {
	pid    uint32
	levels []*level
}

func openSource(dirs []string, pid uint32) (*source, error) {
	s := &source{pid: pid}
	for _, d := range dirs {
		l, err := openLevel(d, pid)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			s.close()
			return nil, err
		}
		s.levels = append(s.levels, l)
	}
	return s, nil
}

func (s *source) close() {
	for _, l := range s.levels {
		l.pages.Close()
	}
}

// span is where pages [vaddr, vaddr+pages) are: at level (in its pages file at off), or nowhere
// (level -1).
type span struct {
	vaddr, pages uint64
	level        int
	off          uint64
}

// spans resolves [vaddr, vaddr+n pages) from level from up the chain, appending to out.
func (s *source) spans(from int, vaddr, n uint64, out []span) []span {
	end := vaddr + n*pageSize
	if from >= len(s.levels) {
		return append(out, span{vaddr: vaddr, pages: n, level: -1})
	}
	l := s.levels[from]
	runs := l.pm.Runs
	i := sort.Search(len(runs), func(i int) bool { return runs[i].End(pageSize) > vaddr })
	for at := vaddr; at < end; {
		if i == len(runs) || runs[i].Vaddr >= end {
			return append(out, span{vaddr: at, pages: (end - at) / pageSize, level: -1})
		}
		r := runs[i]
		if r.Vaddr > at {
			out = append(out, span{vaddr: at, pages: (r.Vaddr - at) / pageSize, level: -1})
			at = r.Vaddr
		}
		stop := min(r.End(pageSize), end)
		k := (stop - at) / pageSize
		switch {
		case r.Present():
			out = append(out, span{vaddr: at, pages: k, level: from, off: l.offs[i] + (at - r.Vaddr)})
		case r.InParent():
			out = s.spans(from+1, at, k, out)
		default:
			out = append(out, span{vaddr: at, pages: k, level: -1})
		}
		at = stop
		i++
	}
	return out
}

// read reads span sp's pages into buf.
func (s *source) read(sp span, buf []byte) error {
	l := s.levels[sp.level]
	if _, err := l.pages.ReadAt(buf[:sp.pages*pageSize], int64(sp.off)); err != nil {
		return fmt.Errorf("pages of process %d at %#x in %s: %w", s.pid, sp.vaddr, l.dir, err)
	}
	return nil
}
