package export

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// Chain returns the frozen layers under (and including) frozen, bottom first, and the snapshot
// they are stacked on: the top layer of the image the container was made from, named by its
// chain id as containerd's unpack names it.
func Chain(ctx context.Context, sn snapshots.Snapshotter, frozen string) (chain []string, base string, err error) {
	for name := frozen; ; {
		info, err := sn.Stat(ctx, name)
		if err != nil {
			return nil, "", fmt.Errorf("frozen layer %s: %w", name, err)
		}
		if info.Labels[checkpoint.LabelID] == "" {
			if name == frozen {
				return nil, "", fmt.Errorf("%s is not a frozen layer of a cklite checkpoint: %w", frozen, errdefs.ErrInvalidArgument)
			}
			return chain, name, nil
		}
		chain = append([]string{name}, chain...)
		if info.Parent == "" {
			return chain, "", nil
		}
		name = info.Parent
	}
}

// BaseChainID is the chain id of base's layers for platform: the name of the snapshot its
// top layer is unpacked into.
func BaseChainID(ctx context.Context, cs content.Provider, base images.Image, platform platforms.MatchComparer) (digest.Digest, error) {
	diffIDs, err := base.RootFS(ctx, cs, platform)
	if err != nil {
		return "", fmt.Errorf("layers of base image %s: %w", base.Name, err)
	}
	return identity.ChainID(diffIDs), nil
}

// Deltas diffs each layer of chain against the one below it (the first against base) with the
// differ d and returns the layers, of layer media type mediaType, in the content store cs of d.
// Progress lines go to progress.
func Deltas(ctx context.Context, sn snapshots.Snapshotter, d diff.Comparer, cs content.Store, mediaType, base string, chain []string, progress io.Writer) ([]Layer, error) {
	var layers []Layer
	parent := base
	for i, name := range chain {
		start := time.Now()
		l, err := delta(ctx, sn, d, cs, mediaType, parent, name)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(progress, "layer %d/%d: %s: %s, %d bytes compressed, %.1fs\n", i+1, len(chain), name, l.Desc.Digest, l.Desc.Size, time.Since(start).Seconds())
		layers = append(layers, l)
		parent = name
	}
	return layers, nil
}

func delta(ctx context.Context, sn snapshots.Snapshotter, d diff.Comparer, cs content.Store, mediaType, parent, name string) (_ Layer, retErr error) {
	upper, err := view(ctx, sn, name)
	if err != nil {
		return Layer{}, err
	}
	defer upper.remove(ctx, &retErr)
	lower := &viewed{}
	if parent != "" {
		if lower, err = view(ctx, sn, parent); err != nil {
			return Layer{}, err
		}
		defer lower.remove(ctx, &retErr)
	}
	desc, err := d.Compare(ctx, lower.mounts, upper.mounts, diff.WithMediaType(mediaType))
	if err != nil {
		return Layer{}, fmt.Errorf("diff frozen layer %s against %s: %w", name, parent, err)
	}
	diffID, err := images.GetDiffID(ctx, cs, desc)
	if err != nil {
		return Layer{}, fmt.Errorf("diff of %s: %w", name, err)
	}
	return Layer{Desc: desc, DiffID: diffID}, nil
}

// LayerMediaType is the layer media type of compression "zstd", "gzip" or "none".
func LayerMediaType(compression string) (string, error) {
	switch compression {
	case "zstd":
		return ocispec.MediaTypeImageLayerZstd, nil
	case "gzip":
		return ocispec.MediaTypeImageLayerGzip, nil
	case "none":
		return ocispec.MediaTypeImageLayer, nil
	}
	return "", fmt.Errorf("compression %q: want zstd, gzip or none: %w", compression, errdefs.ErrInvalidArgument)
}

// viewed is a read-only view of a committed snapshot, for the differ.
type viewed struct {
	sn     snapshots.Snapshotter
	key    string
	mounts []mount.Mount
}

func view(ctx context.Context, sn snapshots.Snapshotter, name string) (*viewed, error) {
	key := fmt.Sprintf("cklite-export-%d-%s", time.Now().UnixNano(), name)
	mounts, err := sn.View(ctx, key, name)
	if err != nil {
		return nil, fmt.Errorf("view of %s: %w", name, err)
	}
	return &viewed{sn: sn, key: key, mounts: mounts}, nil
}

// remove drops the view, reporting a failure into *errp unless an error is already there.
func (v *viewed) remove(ctx context.Context, errp *error) {
	if err := v.sn.Remove(context.WithoutCancel(ctx), v.key); err != nil && *errp == nil {
		*errp = fmt.Errorf("remove view %s: %w", v.key, err)
	}
}
