package client

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/criuimage"
	"github.com/cklite/cklite/pkg/pagechain"
)

// MemoryStored is the disk a checkpoint's memory takes in its image directory dir now: the
// directory's own files less cklite's own (checkpoint.MetaFile, pagechain.ReportFile), so that
// it compares with the size of the dump as CRIU wrote it (Meta.MemoryBytes). What the directory
// shares with its parent image directory is the parent's: the pages it reads from there (the
// parent link is not followed) and the files that are hard links to the parent's (pagechain
// links a dump's files equal to the parent's).
func MemoryStored(dir string) (int64, error) {
	inParent, err := parentInodes(dir)
	if err != nil {
		return 0, err
	}
	var total int64
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() || (filepath.Dir(path) == filepath.Clean(dir) && (d.Name() == checkpoint.MetaFile || d.Name() == pagechain.ReportFile)) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !inParent[inodeOf(info)] {
			total += info.Size()
		}
		return nil
	})
	return total, err
}

// parentInodes are the inodes of the regular files of dir's parent image directory; none
// without a parent.
func parentInodes(dir string) (map[[2]uint64]bool, error) {
	parent := filepath.Join(dir, criuimage.ParentLink)
	entries, err := os.ReadDir(parent)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[[2]uint64]bool{}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, err
		}
		out[inodeOf(info)] = true
	}
	return out, nil
}

func inodeOf(fi os.FileInfo) [2]uint64 {
	st := fi.Sys().(*syscall.Stat_t)
	return [2]uint64{st.Dev, st.Ino}
}
