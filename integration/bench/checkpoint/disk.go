package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	imagespec "github.com/opencontainers/image-spec/specs-go/v1"
)

// fsDisk is what cklite's checkpoints keep of the filesystem: the snapshotter's root (frozen
// layers and uppers), without the CRIU images.
func (s *ckliteBox) fsDisk() (int64, error) { return diskUsage(s.diskDirs()[0]) }

// fsDisk is what stock's checkpoints keep of the filesystem: the rw diff blobs of its checkpoint
// images (the layer descriptors WithCheckpointRW adds to each checkpoint's index).
func (s *stockBox) fsDisk() (int64, error) {
	var total int64
	for _, img := range s.images {
		data, err := content.ReadBlob(s.ctx, s.d.Client().ContentStore(), img.Target())
		if err != nil {
			return 0, err
		}
		var index imagespec.Index
		if err := json.Unmarshal(data, &index); err != nil {
			return 0, fmt.Errorf("checkpoint index of %s: %w", img.Name(), err)
		}
		for _, d := range index.Manifests {
			if images.IsLayerType(d.MediaType) {
				total += d.Size
			}
		}
	}
	return total, nil
}

// dedupSavings is how much less dirs would occupy if identical regular files of at least
// minDedup bytes were stored once: what cklite-snapshotter's -dedup option does for frozen
// layers, computed here over everything in dirs (uppers included) since the benchmark's
// snapshotter runs without it. Hard links are counted once, as diskUsage does.
func dedupSavings(dirs ...string) (int64, error) {
	const minDedup = 4096 // as the snapshotter's minDedupSize
	type key struct {
		size int64
		sum  [32]byte
	}
	seenInode := map[[2]uint64]bool{}
	seen := map[key]bool{}
	var saved int64
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if os.IsNotExist(err) {
					return nil
				}
				return err
			}
			if !d.Type().IsRegular() {
				return nil
			}
			fi, err := d.Info()
			if err != nil || fi.Size() < minDedup {
				return nil
			}
			st := fi.Sys().(*syscall.Stat_t)
			if ino := [2]uint64{st.Dev, st.Ino}; seenInode[ino] {
				return nil
			} else {
				seenInode[ino] = true
			}
			f, err := os.Open(path)
			if err != nil {
				return nil // gone meanwhile
			}
			h := sha256.New()
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("reading %s: %w", path, err)
			}
			k := key{size: fi.Size()}
			copy(k.sum[:], h.Sum(nil))
			if seen[k] {
				saved += st.Blocks * 512
			}
			seen[k] = true
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("dedup estimate of %s: %w", dir, err)
		}
	}
	return saved, nil
}
