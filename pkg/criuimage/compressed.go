package criuimage

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/zstd"
)

// CompressedSuffix ends the name of a pages file that cklite stores compressed (pkg/pagechain):
// pages-<id>.img.zst is pages-<id>.img as one zstd frame that records its content size. CRIU
// cannot read it: a restore materialises it first. Where both names are present (a compression
// killed between its rename and its removal of the plain file), the plain file is read.
const CompressedSuffix = ".zst"

// PagesSize is the size of pages file name of dir as CRIU reads it: the plain file's, or, when
// only the compressed one is there, the content size its frame header records.
func PagesSize(dir, name string) (int64, error) {
	size, err := fileSize(filepath.Join(dir, name))
	if !errors.Is(err, os.ErrNotExist) {
		return size, err
	}
	f, err2 := os.Open(filepath.Join(dir, name+CompressedSuffix))
	if errors.Is(err2, os.ErrNotExist) {
		return 0, err // the plain file's: the name the pagemap gives
	}
	if err2 != nil {
		return 0, err2
	}
	defer f.Close()
	return CompressedContentSize(f)
}

// CompressedContentSize reads the content size from the header of the zstd frame r starts with.
func CompressedContentSize(r io.Reader) (int64, error) {
	buf := make([]byte, zstd.HeaderMaxSize)
	n, err := io.ReadFull(r, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return 0, err
	}
	var h zstd.Header
	if err := h.Decode(buf[:n]); err != nil {
		return 0, fmt.Errorf("compressed pages file: %w", err)
	}
	if !h.HasFCS {
		return 0, errors.New("compressed pages file: no content size in its frame header")
	}
	return int64(h.FrameContentSize), nil
}
