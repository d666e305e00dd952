package client

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/pagechain"
)

// MemoryStored is the disk a checkpoint's memory takes in its image directory dir now: the
// directory's own files (the parent link, to the pages it shares with the parent checkpoint's
// images, is not followed) less cklite's own (checkpoint.MetaFile, pagechain.ReportFile), so
// that it compares with the size of the dump as CRIU wrote it (Meta.MemoryBytes).
func MemoryStored(dir string) (int64, error) {
	total, err := checkpoint.ImageSize(dir)
	if err != nil {
		return 0, err
	}
	for _, name := range []string{checkpoint.MetaFile, pagechain.ReportFile} {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		total -= fi.Size()
	}
	return total, nil
}
