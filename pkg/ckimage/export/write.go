// Package export writes cklite checkpoint images (see package ckimage for the format): the deltas
// of a checkpoint's frozen chain, the image itself, and OCI archives of it, for `cklite checkpoint
// export` and `import`.
package export

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	imagespec "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/ckimage"
	"github.com/cklite/cklite/pkg/pagechain"
)

// Layer is one delta layer of a checkpoint image: a blob in the content store and the digest of
// its uncompressed tar.
type Layer struct {
	Desc   ocispec.Descriptor
	DiffID digest.Digest
}

// Spec is what a checkpoint image is made of.
type Spec struct {
	Base     images.Image // the image the checkpointed container ran
	Deltas   []Layer      // the checkpoint's filesystem on top of Base, bottom first
	CRIUDir  string       // the CRIU image directory, with cklite.json
	Meta     checkpoint.Meta
	Platform platforms.MatchComparer // of Base's manifest; nil: this host's
	// Spec is the checkpointed container's, when known: its bind mounts are recorded.
	Spec *specs.Spec
}

// Write stores the checkpoint image of s in cs (config, CRIU blob, manifest) and returns the
// manifest's descriptor. The caller holds a lease until an image record points at it.
func Write(ctx context.Context, cs content.Store, s Spec) (ocispec.Descriptor, error) {
	platform := s.Platform
	if platform == nil {
		platform = platforms.Default()
	}
	base, err := images.Manifest(ctx, cs, s.Base.Target, platform)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("manifest of base image %s: %w", s.Base.Name, err)
	}
	data, err := content.ReadBlob(ctx, cs, base.Config)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("config of base image %s: %w", s.Base.Name, err)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(data, &cfg); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("config of base image %s: %w", s.Base.Name, err)
	}
	// A checkpoint of a container restored from a checkpoint image stacks on that image: its
	// layers, not its CRIU images.
	baseLayers := slices.DeleteFunc(slices.Clone(base.Layers), func(d ocispec.Descriptor) bool { return d.MediaType == ckimage.MediaTypeCheckpoint })
	if len(cfg.RootFS.DiffIDs) != len(baseLayers) {
		return ocispec.Descriptor{}, fmt.Errorf("base image %s has %d layers and %d diff ids: %w", s.Base.Name, len(baseLayers), len(cfg.RootFS.DiffIDs), errdefs.ErrInvalidArgument)
	}
	criu, err := writeDirTar(ctx, cs, s.CRIUDir, s.Meta.ID)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := checkpointConfig(&cfg, s); err != nil {
		return ocispec.Descriptor{}, err
	}
	configDesc, err := writeJSON(ctx, cs, ocispec.MediaTypeImageConfig, cfg, nil)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	layers := baseLayers
	for _, l := range s.Deltas {
		layers = append(layers, l.Desc)
	}
	layers = append(layers, criu)
	m := ocispec.Manifest{
		Versioned: imagespec.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Layers:    layers,
		Annotations: map[string]string{
			ckimage.LabelCheckpoint:         s.Meta.ID,
			ocispec.AnnotationBaseImageName: s.Base.Name,
		},
	}
	// containerd's collector keeps what the manifest references only through these labels.
	gc := map[string]string{"containerd.io/gc.ref.content.config": configDesc.Digest.String()}
	for i, l := range layers {
		gc["containerd.io/gc.ref.content.l."+strconv.Itoa(i)] = l.Digest.String()
	}
	return writeJSON(ctx, cs, ocispec.MediaTypeImageManifest, m, gc)
}

// checkpointConfig turns the base image's config into the checkpoint image's.
func checkpointConfig(cfg *ocispec.Image, s Spec) error {
	labels := maps.Clone(cfg.Config.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	// On a checkpoint image, the originals are in its labels already.
	if !ckimage.IsMarker(cfg.Config.Entrypoint) {
		entrypoint, err := json.Marshal(cfg.Config.Entrypoint)
		if err != nil {
			return err
		}
		cmd, err := json.Marshal(cfg.Config.Cmd)
		if err != nil {
			return err
		}
		labels[ckimage.LabelEntrypoint] = string(entrypoint)
		labels[ckimage.LabelCmd] = string(cmd)
		labels[ckimage.LabelBase] = s.Base.Name
	}
	labels[ckimage.LabelCheckpoint] = s.Meta.ID
	delete(labels, ckimage.LabelBindMounts) // the base's, if a checkpoint image
	if s.Spec != nil {
		mounts, err := json.Marshal(ckimage.BindMounts(s.Spec))
		if err != nil {
			return err
		}
		labels[ckimage.LabelBindMounts] = string(mounts)
	}
	cfg.Config.Labels = labels
	cfg.Config.Entrypoint = []string{ckimage.Marker}
	cfg.Config.Cmd = nil
	now := time.Now().UTC()
	cfg.Created = &now
	for i, l := range s.Deltas {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.DiffID)
		cfg.History = append(cfg.History, ocispec.History{
			Created:   &now,
			CreatedBy: fmt.Sprintf("cklite checkpoint %s: frozen layer %d of %d", s.Meta.ID, i+1, len(s.Deltas)),
		})
	}
	return nil
}

func writeJSON(ctx context.Context, cs content.Store, mediaType string, v any, labels map[string]string) (ocispec.Descriptor, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
	ref := "cklite-" + desc.Digest.Encoded()
	if err := content.WriteBlob(ctx, cs, ref, bytes.NewReader(data), desc, content.WithLabels(labels)); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("write %s: %w", mediaType, err)
	}
	return desc, nil
}

// writeDirTar stores the files of dir as a zstd-compressed tar of ckimage.MediaTypeCheckpoint. The tar
// is reproducible (sorted, no times, no owners).
func writeDirTar(ctx context.Context, cs content.Store, dir, id string) (ocispec.Descriptor, error) {
	if _, err := checkpoint.Read(dir); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := checkpoint.CheckImages(dir); err != nil {
		return ocispec.Descriptor{}, err
	}
	// A checkpoint image stands alone: memory stored as what changed since a parent checkpoint's
	// is exported whole, from a flattened copy beside the directory (pkg/pagechain).
	dir, done, err := pagechain.Flatten(dir, filepath.Dir(dir))
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer done()
	w, err := content.OpenWriter(ctx, cs, content.WithRef("cklite-checkpoint-"+id))
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("write CRIU image blob: %w", err)
	}
	defer w.Close()
	if err := w.Truncate(0); err != nil {
		return ocispec.Descriptor{}, err
	}
	cw := &countingWriter{w: w}
	// Memory pages compress well (zero pages, heaps) and zstd keeps up with the disk.
	zw, err := compression.CompressStream(cw, compression.Zstd)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := tarDir(zw, dir); err != nil {
		zw.Close()
		return ocispec.Descriptor{}, fmt.Errorf("tar CRIU images of %s: %w", dir, err)
	}
	if err := zw.Close(); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("compress CRIU images of %s: %w", dir, err)
	}
	desc := ocispec.Descriptor{
		MediaType:   ckimage.MediaTypeCheckpoint,
		Digest:      w.Digest(),
		Size:        cw.n,
		Annotations: map[string]string{ocispec.AnnotationTitle: "checkpoint.tar.zst"},
	}
	if err := w.Commit(ctx, cw.n, desc.Digest); err != nil && !errdefs.IsAlreadyExists(err) {
		return ocispec.Descriptor{}, fmt.Errorf("commit CRIU image blob: %w", err)
	}
	return desc, nil
}

func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() && !info.IsDir() {
			return fmt.Errorf("%s: not a regular file or directory", path)
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		h.ModTime, h.AccessTime, h.ChangeTime = time.Unix(0, 0), time.Time{}, time.Time{}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
