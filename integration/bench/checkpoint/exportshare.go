package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// exportSharer is a sandbox whose checkpoints export as images that share their parents' blobs
// (cklite: docs/checkpoints.md, checkpoint images share what their parents hold).
type exportSharer interface {
	// exportShare exports the last two checkpoints taken, N and N+1, as checkpoint images and
	// returns the size of N+1's image (its blobs and config) and of what of it N's image lacks:
	// what a push of N+1 to a registry holding N uploads, and a node that pulled N fetches.
	exportShare() (image, pushed int64, err error)
}

// exportShareOf is exportShare of b, zeros for a sandbox that is no exportSharer or took fewer
// than two checkpoints.
func exportShareOf(b sandbox) (image, pushed int64, err error) {
	if s, ok := b.(exportSharer); ok {
		return s.exportShare()
	}
	return 0, 0, nil
}

func (s *ckliteBox) exportShare() (image, pushed int64, err error) {
	taken := slices.Sorted(maps.Keys(s.ids))
	if len(taken) < 2 {
		return 0, 0, nil
	}
	var blobs []map[digest.Digest]int64
	for _, i := range taken[len(taken)-2:] {
		ref := fmt.Sprintf("localhost/cklite/bench-export:%s-ck%d", s.cid, i)
		out, err := s.d.Cklite(s.ctx, "checkpoint", "export", "--format", "json", "--ref", ref, s.ids[i])
		if err != nil {
			return 0, 0, fmt.Errorf("export checkpoint %d: %w", i, err)
		}
		var res struct {
			Image string `json:"image"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			return 0, 0, fmt.Errorf("export checkpoint %d: %w: %s", i, err, out)
		}
		img, err := s.d.Client().ImageService().Get(s.ctx, res.Image)
		if err != nil {
			return 0, 0, err
		}
		m, err := images.Manifest(s.ctx, s.d.Client().ContentStore(), img.Target, platforms.Default())
		if err != nil {
			return 0, 0, err
		}
		blobs = append(blobs, manifestBlobs(m))
		// Measured: the image goes, its content with containerd's collector.
		if err := s.d.Client().ImageService().Delete(s.ctx, ref); err != nil {
			return 0, 0, err
		}
	}
	for d, n := range blobs[1] {
		image += n
		if _, ok := blobs[0][d]; !ok {
			pushed += n
		}
	}
	return image, pushed, nil
}

// manifestBlobs is the blobs of m, config included, and their sizes.
func manifestBlobs(m ocispec.Manifest) map[digest.Digest]int64 {
	b := map[digest.Digest]int64{m.Config.Digest: m.Config.Size}
	for _, l := range m.Layers {
		b[l.Digest] = l.Size
	}
	return b
}
