package criuimage

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protowire"
)

// Pagemap entry flags (CRIU's pagemap.h): the run's pages are in the parent image directory
// (PE_PARENT), may be restored lazily (PE_LAZY), are in this directory's pages file (PE_PRESENT).
const (
	PageParent  = 1 << 0
	PageLazy    = 1 << 1
	PagePresent = 1 << 2
)

// PageRun is one pagemap entry: Pages pages from virtual address Vaddr.
type PageRun struct {
	Vaddr uint64
	Pages uint64
	Flags uint32
}

// End is the address just past the run.
func (r PageRun) End(pageSize uint64) uint64 { return r.Vaddr + r.Pages*pageSize }

// Present reports whether the run's pages are in this directory's pages file.
func (r PageRun) Present() bool { return r.Flags&PagePresent != 0 }

// InParent reports whether the run's pages are in the parent image directory.
func (r PageRun) InParent() bool { return r.Flags&PageParent != 0 }

// PagemapFile is a whole pagemap-*.img: the pages file it points to (pages-<PagesID>.img) and its
// runs, in the order CRIU wrote them (ascending addresses). The present runs' pages follow each
// other in the pages file, in that order.
type PagemapFile struct {
	PagesID uint32
	Runs    []PageRun
}

// PagesName is the name of the pages file the pagemap points to.
func (pm PagemapFile) PagesName() string { return PagesName(pm.PagesID) }

// PagesName is the name of pages file id.
func PagesName(id uint32) string { return fmt.Sprintf("pages-%d.img", id) }

// PresentPages counts the pages the pages file holds.
func (pm PagemapFile) PresentPages() uint64 {
	var n uint64
	for _, r := range pm.Runs {
		if r.Present() {
			n += r.Pages
		}
	}
	return n
}

// ReadPagemap decodes the pagemap image at path.
func ReadPagemap(path string) (PagemapFile, error) {
	ents, err := readImage(path, magicPagemap)
	if err != nil {
		return PagemapFile{}, err
	}
	return decodePagemapFile(filepath.Base(path), ents)
}

func decodePagemapFile(name string, entries [][]byte) (PagemapFile, error) {
	if len(entries) == 0 {
		return PagemapFile{}, fmt.Errorf("%s: no pagemap head", name)
	}
	var pm PagemapFile
	head, err := fields(entries[0])
	if err != nil {
		return pm, fmt.Errorf("%s: head: %w", name, err)
	}
	for _, f := range head {
		if f.num == 1 {
			pm.PagesID = uint32(f.v)
		}
	}
	for i, e := range entries[1:] {
		r, err := decodeRun(e)
		if err != nil {
			return pm, fmt.Errorf("%s: entry %d: %w", name, i, err)
		}
		pm.Runs = append(pm.Runs, r)
	}
	return pm, nil
}

func decodeRun(b []byte) (PageRun, error) {
	fs, err := fields(b)
	if err != nil {
		return PageRun{}, err
	}
	var r PageRun
	inParent, hasFlags, hasPages := false, false, false
	for _, f := range fs {
		switch f.num {
		case 1:
			r.Vaddr = f.v
		case 2: // compat_nr_pages (u32), 0 in CRIU 4.x images, which have nr_pages (u64)
			if !hasPages {
				r.Pages = f.v
			}
		case 5:
			r.Pages, hasPages = f.v, true
		case 3:
			inParent = f.v != 0
		case 4:
			r.Flags, hasFlags = uint32(f.v), true
		}
	}
	// As CRIU's init_compat_pagemap_entry: images older than flags say in_parent or nothing.
	if inParent {
		r.Flags |= PageParent
	} else if !hasFlags {
		r.Flags = PagePresent
	}
	return r, nil
}

// Encode is the pagemap image as CRIU 4.x writes it: the image-set and pagemap magics, the head,
// then one entry a run (vaddr, compat_nr_pages 0, flags, nr_pages).
func (pm PagemapFile) Encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, magicCommon)
	b = binary.LittleEndian.AppendUint32(b, magicPagemap)
	appendEntry := func(e []byte) {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
	}
	head := protowire.AppendTag(nil, 1, protowire.VarintType)
	appendEntry(protowire.AppendVarint(head, uint64(pm.PagesID)))
	for _, r := range pm.Runs {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.VarintType)
		e = protowire.AppendVarint(e, r.Vaddr)
		e = protowire.AppendTag(e, 2, protowire.VarintType)
		e = protowire.AppendVarint(e, 0)
		e = protowire.AppendTag(e, 4, protowire.VarintType)
		e = protowire.AppendVarint(e, uint64(r.Flags))
		e = protowire.AppendTag(e, 5, protowire.VarintType)
		e = protowire.AppendVarint(e, r.Pages)
		appendEntry(e)
	}
	return b
}

// PagemapPids lists the processes of dir that have a pagemap (pagemap-<pid>.img; shared memory's
// pagemap-shmem-*.img are not processes').
func PagemapPids(dir string) ([]uint32, error) {
	names, err := filepath.Glob(filepath.Join(dir, "pagemap-*.img"))
	if err != nil {
		return nil, err
	}
	var pids []uint32
	for _, n := range names {
		var pid uint32
		var rest string
		base := filepath.Base(n)
		if c, _ := fmt.Sscanf(base, "pagemap-%d.img%s", &pid, &rest); c == 1 && base == PagemapName(pid) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// PagemapName is the name of process pid's pagemap.
func PagemapName(pid uint32) string { return fmt.Sprintf("pagemap-%d.img", pid) }

// PagesFiles maps the pages files the pagemaps of dir (processes' and shared memory's) point to,
// by name, to the pagemap naming each.
func PagesFiles(dir string) (map[string]string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "pagemap-*.img"))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, n := range names {
		if filepath.Ext(n) != ".img" {
			continue
		}
		pm, err := ReadPagemap(n)
		if err != nil {
			return nil, err
		}
		out[pm.PagesName()] = filepath.Base(n)
	}
	return out, nil
}

// fileSize is the size of the file at path.
func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
