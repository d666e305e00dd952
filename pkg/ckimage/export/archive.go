package export

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/ckimage"
)

// Archive is a checkpoint archive as the CRI's CheckpointContainer writes it (the kubelet's
// checkpoint), unpacked into Dir.
type Archive struct {
	Dir string
	// Config is config.dump: which container was checkpointed and from which image.
	Config ArchiveConfig
	// Spec is spec.dump, the checkpointed container's spec; nil if the archive has none.
	Spec *specs.Spec
}

// ArchiveConfig is the part of config.dump (checkpointctl's ContainerConfig) an export needs.
type ArchiveConfig struct {
	ID              string `json:"id"`
	Name            string `json:"name"`
	RootfsImageName string `json:"rootfsImageName,omitempty"`
	RootfsImageRef  string `json:"rootfsImageRef,omitempty"`
}

// CRIUDir is the archive's CRIU image directory.
func (a Archive) CRIUDir() string { return filepath.Join(a.Dir, "checkpoint") }

// OpenCheckpointImage unpacks the CRIU images of a containerd checkpoint image (what `ctr
// containers checkpoint` and the Go client's Task.Checkpoint make: an index whose CRIU tar is
// a blob of images.MediaTypeContainerd1Checkpoint) into a new directory under tmpRoot, removed by
// the caller. An image that is no checkpoint is errdefs.ErrNotFound.
func OpenCheckpointImage(ctx context.Context, cs content.Provider, name string, target ocispec.Descriptor, tmpRoot string) (string, error) {
	if !images.IsIndexType(target.MediaType) {
		return "", fmt.Errorf("image %s is not a containerd checkpoint image: %w", name, errdefs.ErrNotFound)
	}
	data, err := content.ReadBlob(ctx, cs, target)
	if err != nil {
		return "", fmt.Errorf("checkpoint image %s: %w", name, err)
	}
	var index ocispec.Index
	if err := json.Unmarshal(data, &index); err != nil {
		return "", fmt.Errorf("checkpoint image %s: %w", name, err)
	}
	i := slices.IndexFunc(index.Manifests, func(d ocispec.Descriptor) bool { return d.MediaType == images.MediaTypeContainerd1Checkpoint })
	if i < 0 {
		return "", fmt.Errorf("image %s holds no CRIU images: %w", name, errdefs.ErrNotFound)
	}
	ra, err := cs.ReaderAt(ctx, index.Manifests[i])
	if err != nil {
		return "", fmt.Errorf("CRIU images of checkpoint image %s: %w", name, err)
	}
	defer ra.Close()
	r, err := compression.DecompressStream(content.NewReader(ra))
	if err != nil {
		return "", fmt.Errorf("CRIU images of checkpoint image %s: %w", name, err)
	}
	defer r.Close()
	dir, err := os.MkdirTemp(tmpRoot, "cklite-criu-")
	if err != nil {
		return "", err
	}
	if err := ckimage.Untar(r, dir); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("CRIU images of checkpoint image %s: %w", name, err)
	}
	return dir, nil
}

// OpenArchive unpacks the archive at path into a new directory under tmpRoot (removed by the
// caller) and reads its config.dump.
func OpenArchive(path, tmpRoot string) (Archive, error) {
	f, err := os.Open(path)
	if err != nil {
		return Archive{}, fmt.Errorf("checkpoint archive: %w", err)
	}
	defer f.Close()
	dir, err := os.MkdirTemp(tmpRoot, "cklite-archive-")
	if err != nil {
		return Archive{}, err
	}
	a := Archive{Dir: dir}
	if err := ckimage.Untar(f, dir); err != nil {
		os.RemoveAll(dir)
		return Archive{}, fmt.Errorf("checkpoint archive %s: %w: %w", path, err, errdefs.ErrInvalidArgument)
	}
	data, err := os.ReadFile(filepath.Join(dir, "config.dump"))
	if err == nil {
		err = json.Unmarshal(data, &a.Config)
	}
	if err != nil {
		os.RemoveAll(dir)
		return Archive{}, fmt.Errorf("checkpoint archive %s has no readable config.dump (not a CRI checkpoint?): %w: %w", path, err, errdefs.ErrInvalidArgument)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "spec.dump")); err == nil {
		a.Spec = &specs.Spec{}
		if err := json.Unmarshal(data, a.Spec); err != nil {
			os.RemoveAll(dir)
			return Archive{}, fmt.Errorf("spec.dump of checkpoint archive %s: %w: %w", path, err, errdefs.ErrInvalidArgument)
		}
	}
	return a, nil
}
