package pagechain

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/cklite/cklite/pkg/criuimage"
)

// pagesReader reads a pages file as CRIU would: plain, or decompressed.
type pagesReader interface {
	io.ReaderAt
	Close() error
}

// openPages opens pages file name of dir: the plain file when it is there (a compression killed
// before it removed it left both, equal), else the compressed one. It returns the name on disk
// and the bytes it takes there.
func openPages(dir, name string) (pagesReader, string, int64, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		if f, err2 := os.Open(filepath.Join(dir, name+criuimage.CompressedSuffix)); err2 == nil {
			fi, err := f.Stat()
			if err != nil {
				f.Close()
				return nil, "", 0, err
			}
			return &zstdPages{f: f}, name + criuimage.CompressedSuffix, fi.Size(), nil
		}
	}
	if err != nil {
		return nil, "", 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, "", 0, err
	}
	return f, name, fi.Size(), nil
}

// zstdPages is a compressed pages file, decompressed into memory at its first read: only small
// pages files are compressed (compressMax), and a rewrite reads most of a parent's pages.
type zstdPages struct {
	f    *os.File
	once sync.Once
	data []byte
	err  error
}

func (z *zstdPages) ReadAt(p []byte, off int64) (int, error) {
	z.once.Do(func() { z.data, z.err = decompressFile(z.f) })
	if z.err != nil {
		return 0, z.err
	}
	if off >= int64(len(z.data)) {
		return 0, io.EOF
	}
	n := copy(p, z.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (z *zstdPages) Close() error { return z.f.Close() }

// decoder decompresses pages files; DecodeAll is safe for concurrent use. One decoder, low
// memory: the shim decompresses a file at a time.
var decoder = sync.OnceValues(func() (*zstd.Decoder, error) {
	return zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
})

// decompressFile reads the compressed pages file f whole and returns its content, checked
// against the content size its frame header records.
func decompressFile(f *os.File) ([]byte, error) {
	comp, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<62))
	if err != nil {
		return nil, err
	}
	d, err := decoder()
	if err != nil {
		return nil, err
	}
	var h zstd.Header
	if err := h.Decode(comp); err != nil || !h.HasFCS {
		return nil, fmt.Errorf("compressed pages file %s: no frame header with its size: %v", f.Name(), err)
	}
	out, err := d.DecodeAll(comp, make([]byte, 0, h.FrameContentSize))
	if err != nil {
		return nil, fmt.Errorf("compressed pages file %s: %w", f.Name(), err)
	}
	if uint64(len(out)) != h.FrameContentSize {
		return nil, fmt.Errorf("compressed pages file %s: %d bytes, its header says %d", f.Name(), len(out), h.FrameContentSize)
	}
	return out, nil
}

// PlainPagesName is the name CRIU knows compressed pages file name by (pages-<id>.img); false
// when name is not a compressed pages file.
func PlainPagesName(name string) (string, bool) { return compressedPages(name) }

// ReadCompressed returns the content of compressed pages file name of dir: pages as CRIU reads
// them, for an export that writes the plain file.
func ReadCompressed(dir, name string) ([]byte, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return decompressFile(f)
}
