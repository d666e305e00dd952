package ckimage

import (
	"context"
	"fmt"
	"io"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// MaxConfigSize bounds the config blob of a checkpoint image, which Find reads whole into memory
// (in the shim at a Create, in the client at an import). A checkpoint image's config is its base
// image's with cklite's labels (entrypoint, cmd, base, checkpoint id, bind mounts) and a diff id
// and a history entry per frozen layer, under 200 bytes each: overlayfs stacks at most 500
// layers, so under 100 KiB over the base's, itself a few KiB. An image from elsewhere may
// declare or hold any size, and the shim would allocate it.
const MaxConfigSize = 1 << 20

// readConfig reads the config blob desc, refusing one over MaxConfigSize before reading it: by
// its descriptor's size, then by the size the content store holds (a descriptor may understate
// it; containerd's proxy store takes the descriptor's word, its local store the file's).
func readConfig(ctx context.Context, cs content.Provider, desc ocispec.Descriptor) ([]byte, error) {
	if desc.Size > MaxConfigSize {
		return nil, configTooLarge(desc, desc.Size)
	}
	ra, err := cs.ReaderAt(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer ra.Close()
	if ra.Size() > MaxConfigSize {
		return nil, configTooLarge(desc, ra.Size())
	}
	return io.ReadAll(io.NewSectionReader(ra, 0, ra.Size()))
}

func configTooLarge(desc ocispec.Descriptor, size int64) error {
	return fmt.Errorf("config blob %s is %d bytes, more than the %d a checkpoint image's config may have (a base image's config with cklite's labels is a few KiB): %w",
		desc.Digest, size, MaxConfigSize, errdefs.ErrInvalidArgument)
}
