package pagechain

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/cklite/cklite/pkg/criuimage"
)

// mode is what a rewrite of a process's pagemap does with the pages of levels[0] (the directory
// rewritten) and of its parents (levels[1:]).
type mode int

const (
	// dedup: a present page equal to the parent's at the same address becomes in-parent.
	dedup mode = iota
	// detach: an in-parent page the parent (levels[1]) holds is copied in; pages further up stay
	// in-parent, the parent's parent becoming the directory's parent.
	detach
	// flatten: every in-parent page is copied in; the directory needs no parent any more.
	flatten
)

// chunkPages is how many pages a rewrite reads at once.
const chunkPages = 256

// Counts are what a rewrite wrote: pages in the new pages file and pages left in parents.
type Counts struct {
	Present  uint64 `json:"present"`
	InParent uint64 `json:"inParent"`
}

func (c *Counts) add(o Counts) { c.Present += o.Present; c.InParent += o.InParent }

// emitter builds the new runs and writes the present pages' data to w.
type emitter struct {
	runs []criuimage.PageRun
	w    io.Writer
	n    Counts
}

func (e *emitter) emit(vaddr, pages uint64, flags uint32, data []byte) error {
	if data != nil {
		if _, err := e.w.Write(data[:pages*pageSize]); err != nil {
			return err
		}
	}
	switch {
	case flags&criuimage.PagePresent != 0:
		e.n.Present += pages
	case flags&criuimage.PageParent != 0:
		e.n.InParent += pages
	}
	if k := len(e.runs) - 1; k >= 0 && e.runs[k].Flags == flags && e.runs[k].End(pageSize) == vaddr {
		e.runs[k].Pages += pages
		return nil
	}
	e.runs = append(e.runs, criuimage.PageRun{Vaddr: vaddr, Pages: pages, Flags: flags})
	return nil
}

// rewriteFile is rewrite into the pages file f, which it syncs (it replaces another, and must be
// whole before it does) and closes.
func rewriteFile(src *source, m mode, f *os.File) ([]criuimage.PageRun, Counts, error) {
	bw := bufio.NewWriterSize(f, 1<<20)
	runs, n, err := rewrite(src, m, bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return runs, n, err
}

// rewrite writes process src.pid's pages, as m decides, to w and returns the new runs.
func rewrite(src *source, m mode, w io.Writer) ([]criuimage.PageRun, Counts, error) {
	e := &emitter{w: w}
	own := make([]byte, chunkPages*pageSize)
	other := make([]byte, chunkPages*pageSize)
	top := src.levels[0]
	for i, r := range top.pm.Runs {
		if !r.Present() && !r.InParent() {
			if err := e.emit(r.Vaddr, r.Pages, r.Flags, nil); err != nil {
				return nil, Counts{}, err
			}
			continue
		}
		for done := uint64(0); done < r.Pages; done += chunkPages {
			k := min(chunkPages, r.Pages-done)
			at := r.Vaddr + done*pageSize
			var err error
			if r.Present() {
				own := own[:k*pageSize]
				if err = src.read(span{vaddr: at, pages: k, level: 0, off: top.offs[i] + done*pageSize}, own); err == nil {
					err = rewritePresent(src, m, e, at, k, r.Flags, own, other)
				}
			} else {
				err = rewriteInParent(src, m, e, at, k, other)
			}
			if err != nil {
				return nil, Counts{}, err
			}
		}
	}
	return e.runs, e.n, nil
}

// rewritePresent emits k present pages at vaddr (data own): as they are, or, deduplicating, as
// in-parent where the parent holds the same bytes.
func rewritePresent(src *source, m mode, e *emitter, vaddr, k uint64, flags uint32, own, buf []byte) error {
	if m != dedup {
		return e.emit(vaddr, k, flags, own)
	}
	for _, sp := range src.spans(1, vaddr, k, nil) {
		mine := own[(sp.vaddr-vaddr)/pageSize*pageSize:]
		if sp.level < 0 {
			if err := e.emit(sp.vaddr, sp.pages, flags, mine); err != nil {
				return err
			}
			continue
		}
		if err := src.read(sp, buf); err != nil {
			return err
		}
		for p := uint64(0); p < sp.pages; p++ {
			a, b := mine[p*pageSize:(p+1)*pageSize], buf[p*pageSize:(p+1)*pageSize]
			var err error
			if bytes.Equal(a, b) {
				err = e.emit(sp.vaddr+p*pageSize, 1, criuimage.PageParent, nil)
			} else {
				err = e.emit(sp.vaddr+p*pageSize, 1, flags, a)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// rewriteInParent emits k in-parent pages at vaddr: copied in from where the chain holds them,
// or left in-parent (dedup, and detach for pages above the parent).
func rewriteInParent(src *source, m mode, e *emitter, vaddr, k uint64, buf []byte) error {
	if m == dedup {
		return e.emit(vaddr, k, criuimage.PageParent, nil)
	}
	for _, sp := range src.spans(1, vaddr, k, nil) {
		if sp.level < 0 {
			return fmt.Errorf("process %d: page %#x is in-parent, and no parent image directory holds it", src.pid, sp.vaddr)
		}
		if m == detach && sp.level > 1 {
			if err := e.emit(sp.vaddr, sp.pages, criuimage.PageParent, nil); err != nil {
				return err
			}
			continue
		}
		if err := src.read(sp, buf); err != nil {
			return err
		}
		if err := e.emit(sp.vaddr, sp.pages, criuimage.PagePresent, buf); err != nil {
			return err
		}
	}
	return nil
}
