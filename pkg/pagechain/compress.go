package pagechain

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/cklite/cklite/pkg/criuimage"
	"github.com/cklite/cklite/pkg/fault"
)

// CompressMax is the largest pages file Compress compresses: a restore decompresses every
// compressed pages file of the chain it reads (Materialise), so a large dump (a chain's full
// first dump of a big heap) stays plain, where CRIU reads it in place.
const CompressMax = 16 << 20

// compressLevel is zstd's level for pages files. Measured on the 199 pages files of a tree search
// (20.8 MB, the Go probe's and the shell's changed pages): SpeedFastest stored 1.72 MB at 290
// MB/s, SpeedDefault 1.67 MB at 240-300 MB/s, SpeedBetterCompression 1.65 MB at 100-120 MB/s,
// SpeedBestCompression 1.76 MB at 27 MB/s; all decompress at 400-600 MB/s. Lower-memory
// encoding changed neither size nor speed, and keeps the shim's footprint down.
const compressLevel = zstd.SpeedDefault

// Compressed is what Compress did.
type Compressed struct {
	Files       int   `json:"files,omitempty"`
	BytesBefore int64 `json:"bytesBefore,omitempty"`
	BytesAfter  int64 `json:"bytesAfter,omitempty"`
}

// Compress stores each pages file of the image directory dir of at most CompressMax bytes as one
// zstd frame (pages-<id>.img.zst, criuimage.CompressedSuffix), where that saves a block at least.
// Each file is written aside, synced, renamed into place, and only then is the plain one removed:
// a kill leaves the plain file, or both (readers take the plain one; the next sweep removes it),
// or the compressed one alone. dir is locked exclusively meanwhile.
func Compress(dir string) (Compressed, error) {
	l, err := writeLock(dir)
	if err != nil {
		return Compressed{}, err
	}
	defer l.Unlock()
	if err := sweep(dir); err != nil {
		return Compressed{}, err
	}
	named, err := criuimage.PagesFiles(dir)
	if err != nil {
		return Compressed{}, err
	}
	var c Compressed
	for _, name := range slices.Sorted(maps.Keys(named)) {
		before, after, err := compressFile(dir, name)
		if err != nil {
			return c, fmt.Errorf("compress %s of %s: %w", name, dir, err)
		}
		if after > 0 {
			c.Files++
			c.BytesBefore += before
			c.BytesAfter += after
		}
	}
	return c, nil
}

// encoder compresses pages files; EncodeAll is safe for concurrent use.
var encoder = sync.OnceValues(func() (*zstd.Encoder, error) {
	return zstd.NewWriter(nil, zstd.WithEncoderLevel(compressLevel), zstd.WithEncoderConcurrency(1), zstd.WithLowerEncoderMem(true))
})

// compressFile compresses pages file name of dir, and returns its sizes before and after; 0
// after when it is left as it is (compressed already, too large, or saving less than a block).
func compressFile(dir, name string) (int64, int64, error) {
	path := filepath.Join(dir, name)
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, nil // compressed already
	}
	if err != nil || fi.Size() == 0 || fi.Size() > CompressMax {
		return 0, 0, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	enc, err := encoder()
	if err != nil {
		return 0, 0, err
	}
	// EncodeAll records the content size in the frame header (criuimage.PagesSize reads it).
	comp := enc.EncodeAll(data, make([]byte, 0, len(data)/2))
	if int64(len(comp))+int64(pageSize) > fi.Size() {
		return 0, 0, nil
	}
	tmp := filepath.Join(dir, "."+name+criuimage.CompressedSuffix+".tmp")
	if err := writeFileMode(tmp, comp, fi.Mode().Perm()); err != nil {
		return 0, 0, err
	}
	if err := os.Rename(tmp, path+criuimage.CompressedSuffix); err != nil {
		os.Remove(tmp)
		return 0, 0, err
	}
	if err := syncDir(dir); err != nil {
		return 0, 0, err
	}
	fault.Point(fault.PagechainCompress)
	if err := os.Remove(path); err != nil {
		return 0, 0, err
	}
	return fi.Size(), int64(len(comp)), syncDir(dir)
}

// writeFileMode writes data into a new file path of mode perm, synced.
func writeFileMode(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}
