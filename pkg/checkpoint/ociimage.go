package checkpoint

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// FromImage reads the metadata inside the checkpoint image whose index is target: the Go client
// (and so ctr) tars the CRIU image directory, MetaFile included, into one blob of the index.
// An image that is no checkpoint, or a stock one without MetaFile, is NotFound.
func FromImage(ctx context.Context, cs content.Provider, target ocispec.Descriptor) (Meta, error) {
	if target.MediaType != ocispec.MediaTypeImageIndex && target.MediaType != images.MediaTypeDockerSchema2ManifestList {
		return Meta{}, fmt.Errorf("%s is a %s, not a checkpoint index: %w", target.Digest, target.MediaType, errdefs.ErrNotFound)
	}
	data, err := content.ReadBlob(ctx, cs, target)
	if err != nil {
		return Meta{}, err
	}
	var index ocispec.Index
	if err := json.Unmarshal(data, &index); err != nil {
		return Meta{}, fmt.Errorf("index %s: %w", target.Digest, err)
	}
	for _, d := range index.Manifests {
		if d.MediaType == images.MediaTypeContainerd1Checkpoint {
			return fromCRIUTar(ctx, cs, d)
		}
	}
	return Meta{}, fmt.Errorf("index %s holds no CRIU image: %w", target.Digest, errdefs.ErrNotFound)
}

func fromCRIUTar(ctx context.Context, cs content.Provider, d ocispec.Descriptor) (Meta, error) {
	ra, err := cs.ReaderAt(ctx, d)
	if err != nil {
		return Meta{}, err
	}
	defer ra.Close()
	r, err := compression.DecompressStream(content.NewReader(ra))
	if err != nil {
		return Meta{}, fmt.Errorf("CRIU image %s: %w", d.Digest, err)
	}
	defer r.Close()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return Meta{}, fmt.Errorf("CRIU image %s has no %s (a stock checkpoint): %w", d.Digest, MetaFile, errdefs.ErrNotFound)
		}
		if err != nil {
			return Meta{}, fmt.Errorf("CRIU image %s: %w", d.Digest, err)
		}
		if path.Clean(h.Name) == MetaFile {
			data, err := io.ReadAll(tr)
			if err != nil {
				return Meta{}, fmt.Errorf("CRIU image %s: %w", d.Digest, err)
			}
			return decode(data, MetaFile+" in "+d.Digest.String())
		}
	}
}
