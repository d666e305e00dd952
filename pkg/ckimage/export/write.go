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
	"strings"
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
	"github.com/cklite/cklite/pkg/criuimage"
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
	baseLayers := slices.DeleteFunc(slices.Clone(base.Layers), ckimage.IsMemory)
	if len(cfg.RootFS.DiffIDs) != len(baseLayers) {
		return ocispec.Descriptor{}, fmt.Errorf("base image %s has %d layers and %d diff ids: %w", s.Base.Name, len(baseLayers), len(cfg.RootFS.DiffIDs), errdefs.ErrInvalidArgument)
	}
	memory, err := writeMemory(ctx, cs, s.CRIUDir)
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
	layers = append(layers, memory...)
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
	// The checkpoint's time, not the export's: the same checkpoint exports to the same image.
	var created *time.Time
	if !s.Meta.Created.IsZero() {
		t := s.Meta.Created.UTC()
		created = &t
	}
	cfg.Created = created
	for i, l := range s.Deltas {
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.DiffID)
		cfg.History = append(cfg.History, ocispec.History{
			Created:   created,
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

// writeMemory stores the CRIU images of dir as blobs of ckimage's format and returns them bottom
// first: one of ckimage.MediaTypeCheckpointParent for each image directory of dir's memory chain
// (pkg/pagechain; the root first), then dir's own, of ckimage.MediaTypeCheckpoint. The chain is
// read-locked meanwhile, so no deduplication rewrites a directory while it is read. Each blob is
// its directory alone, whatever the image holds above it: a parent's blob is the one its own
// export wrote, so a registry holding that image has it already.
func writeMemory(ctx context.Context, cs content.Store, dir string) ([]ocispec.Descriptor, error) {
	l, err := pagechain.ReadLock(dir)
	if err != nil {
		return nil, err
	}
	defer l.Unlock()
	var blobs []ocispec.Descriptor
	for i := len(l.Dirs) - 1; i >= 0; i-- {
		mediaType := ckimage.MediaTypeCheckpointParent
		if i == 0 {
			mediaType = ckimage.MediaTypeCheckpoint
		}
		desc, err := writeDirTar(ctx, cs, l.Dirs[i], mediaType)
		if err != nil {
			return nil, err
		}
		blobs = append(blobs, desc)
	}
	return blobs, nil
}

// writeDirTar stores the images of dir as a zstd-compressed tar of mediaType. The tar is
// reproducible (tarDir), and zstd's output depends on its input and level only.
func writeDirTar(ctx context.Context, cs content.Store, dir, mediaType string) (ocispec.Descriptor, error) {
	meta, err := checkpoint.Read(dir)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := checkpoint.CheckImages(dir); err != nil {
		return ocispec.Descriptor{}, err
	}
	named, err := criuimage.PagesFiles(dir)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("image directory %s: %w", dir, err)
	}
	w, err := content.OpenWriter(ctx, cs, content.WithRef("cklite-checkpoint-"+meta.ID))
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
	if err := tarDir(zw, dir, exported(named)); err != nil {
		zw.Close()
		return ocispec.Descriptor{}, fmt.Errorf("tar CRIU images of %s: %w", dir, err)
	}
	if err := zw.Close(); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("compress CRIU images of %s: %w", dir, err)
	}
	desc := ocispec.Descriptor{
		MediaType:   mediaType,
		Digest:      w.Digest(),
		Size:        cw.n,
		Annotations: map[string]string{ocispec.AnnotationTitle: "checkpoint-" + meta.ID + ".tar.zst"},
	}
	if err := w.Commit(ctx, cw.n, desc.Digest); err != nil && !errdefs.IsAlreadyExists(err) {
		return ocispec.Descriptor{}, fmt.Errorf("commit CRIU image blob: %w", err)
	}
	return desc, nil
}

// exported says which entries at the top of an image directory its blob holds: not the parent
// link (an import makes its own, to the parent it extracted), nor what describes the directory
// rather than the checkpoint (pagechain.ReportFile, with its timing), nor what a killed rewrite
// left (hidden temporary files, a pages file no pagemap names; pkg/pagechain sweeps them later):
// so the blob is the same whenever the checkpoint is exported.
func exported(pagesFiles map[string]string) func(name string) bool {
	return func(name string) bool {
		switch {
		case name == criuimage.ParentLink || name == pagechain.ReportFile || strings.HasPrefix(name, "."):
			return false
		case strings.HasPrefix(name, "pages-") && strings.HasSuffix(name, ".img"):
			_, ok := pagesFiles[name]
			return ok
		}
		if plain, ok := pagechain.PlainPagesName(name); ok {
			_, ok := pagesFiles[plain]
			return ok
		}
		return true
	}
}

// tarDir writes the files and directories below dir into w as a tar that depends on their names,
// contents and modes only: in lexical order (WalkDir's), no times, no owners. Entries at the top
// that include refuses are left out.
func tarDir(w io.Writer, dir string, include func(name string) bool) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		if filepath.Dir(rel) == "." && !include(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
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
		if plain, ok := pagechain.PlainPagesName(rel); ok {
			return tarCompressed(tw, h, dir, rel, plain)
		}
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

// tarCompressed writes pages file name of dir, which pkg/pagechain compressed, as the plain file
// plain that CRIU wrote (header h, the compressed file's): the blob does not depend on how the
// pages are stored. Its place in the tar is the plain name's too: no image name sorts between
// pages-<id>.img and pages-<id>.img.zst. Both present (a compression killed before it removed
// the plain file): the plain one is written, in its place.
func tarCompressed(tw *tar.Writer, h *tar.Header, dir, name, plain string) error {
	if _, err := os.Lstat(filepath.Join(dir, plain)); err == nil {
		return nil
	}
	data, err := pagechain.ReadCompressed(dir, name)
	if err != nil {
		return err
	}
	h.Name, h.Size = plain, int64(len(data))
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err = tw.Write(data)
	return err
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
