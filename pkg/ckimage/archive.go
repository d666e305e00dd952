package ckimage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Archive is a checkpoint archive as the CRI's CheckpointContainer writes it (the kubelet's
// checkpoint), unpacked into Dir.
type Archive struct {
	Dir string
	// Config is config.dump: which container was checkpointed and from which image.
	Config ArchiveConfig
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

// rootfsDiff is the container's rw layer at the checkpoint, the blob containerd made of it.
func (a Archive) rootfsDiff() string { return filepath.Join(a.Dir, "rootfs-diff.tar") }

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
	if err := untar(f, dir); err != nil {
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
	return a, nil
}

// RootfsDiffLayer stores the archive's rootfs-diff.tar as one delta layer, for a checkpoint whose
// frozen chain is not on this host: it holds the container's rw layer as containerd diffed it.
func (a Archive) RootfsDiffLayer(ctx context.Context, cs content.Store) (Layer, error) {
	f, err := os.Open(a.rootfsDiff())
	if errors.Is(err, os.ErrNotExist) {
		return Layer{}, fmt.Errorf("checkpoint archive has no rootfs-diff.tar and its frozen layers are not on this host: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return Layer{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return Layer{}, err
	}
	// The blob's digest and the digest of what it decompresses to, in one read.
	blob := digest.Canonical.Digester()
	tee := io.TeeReader(f, blob.Hash())
	plain, err := compression.DecompressStream(tee)
	if err != nil {
		return Layer{}, fmt.Errorf("rootfs-diff.tar: %w", err)
	}
	diffID := digest.Canonical.Digester()
	_, err = io.Copy(diffID.Hash(), plain)
	compressed := plain.GetCompression()
	plain.Close()
	if err == nil {
		_, err = io.Copy(io.Discard, tee) // what the decompressor left unread
	}
	if err != nil {
		return Layer{}, fmt.Errorf("rootfs-diff.tar: %w", err)
	}
	mediaType := ocispec.MediaTypeImageLayerGzip
	if compressed == compression.Uncompressed {
		mediaType = ocispec.MediaTypeImageLayer
	}
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: blob.Digest(), Size: info.Size()}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Layer{}, err
	}
	if err := content.WriteBlob(ctx, cs, "cklite-"+desc.Digest.Encoded(), f, desc); err != nil {
		return Layer{}, fmt.Errorf("store rootfs-diff.tar: %w", err)
	}
	return Layer{Desc: desc, DiffID: diffID.Digest()}, nil
}
