package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/ckimage"
	"github.com/cklite/cklite/pkg/ckimage/export"
	"github.com/cklite/cklite/pkg/fault"
	"github.com/cklite/cklite/pkg/fork"
	"github.com/cklite/cklite/pkg/pagechain"
)

// ExportOptions shape Export.
type ExportOptions struct {
	// Ref names the checkpoint image in containerd: a full reference, as nerdctl names images
	// (registry/repository:tag), so that nerdctl finds, pushes and removes it.
	Ref string
	// Archive, if set, is a file to write the image to as an OCI archive as well.
	Archive string
	// Compression of the delta layers: zstd (default), gzip or none.
	Compression string
	// Base is the image the checkpointed container ran (default: the container's, or the CRI
	// archive's).
	Base string
	// Spec is the checkpointed container's runtime spec, for a checkpoint whose container is
	// gone (default: the container's, or the CRI archive's): the image records its bind mounts.
	Spec     *specs.Spec
	Progress io.Writer // where to say what is being done (nil: nowhere)
}

// Export makes the checkpoint src names (an id, name or prefix; a CRIU image directory; a CRI
// checkpoint archive; or a containerd checkpoint image) an OCI image that a cklite container
// restores from, named opts.Ref. A failed export leaves nothing: a bad reference or an archive
// path that cannot be written is refused before anything is made, and what a later failure would
// leave is removed again.
//
// A killed export leaves nothing that import, nerdctl or a registry push would take for the
// image: its blobs are written under a lease (containerd's collector frees them when it
// expires), the archive is written as <archive>.partial and renamed when complete (the next
// export to the same path replaces a partial one), and the image record, one transaction, is
// made last.
func (c *Client) Export(ctx context.Context, arg string, opts ExportOptions) (_ Exported, retErr error) {
	ctx = c.Context(ctx)
	if err := ValidateRef(opts.Ref); err != nil {
		return Exported{}, err
	}
	if opts.Compression == "" {
		opts.Compression = "zstd"
	}
	mediaType, err := export.LayerMediaType(opts.Compression)
	if err != nil {
		return Exported{}, err
	}
	var out *os.File
	partial := opts.Archive + ".partial"
	if opts.Archive != "" {
		if out, err = os.Create(partial); err != nil {
			return Exported{}, fmt.Errorf("archive: %w", err)
		}
		defer func() {
			out.Close()
			if retErr != nil {
				os.Remove(partial)
				os.Remove(opts.Archive)
			}
		}()
	}
	pw := opts.Progress
	if pw == nil {
		pw = io.Discard
	}
	ctx, done, err := c.ctrd.WithLease(ctx, leases.WithExpiration(time.Hour))
	if err != nil {
		return Exported{}, err
	}
	defer done(context.WithoutCancel(ctx)) //nolint:errcheck
	e := &exporter{c: c, progress: pw, base: opts.Base, spec: opts.Spec, mediaType: mediaType}
	src, err := e.source(ctx, arg)
	if err != nil {
		return Exported{}, err
	}
	defer src.close()
	start := time.Now()
	img, err := e.export(ctx, src, opts.Ref)
	if err != nil {
		return Exported{}, err
	}
	fault.Point(fault.ExportLayers)
	fmt.Fprintf(pw, "image %s: %s (%.1fs)\n", img.Name, img.Target.Digest, time.Since(start).Seconds())
	res := Exported{Image: img.Name, Digest: img.Target.Digest.String(), Checkpoint: src.meta.ID, CheckpointName: src.meta.Name}
	if out != nil {
		if res.ArchiveBytes, err = exportArchive(ctx, c.ctrd, img, out, opts.Archive, pw); err != nil {
			return Exported{}, err
		}
		res.Archive = opts.Archive
	}
	if err := e.record(ctx, img); err != nil {
		return Exported{}, err
	}
	res.TookMs = time.Since(start).Milliseconds()
	return res, nil
}

// ValidateRef refuses an image reference nerdctl would not find under that name: not a
// reference, or not in its full form (nerdctl looks "app:1" up as docker.io/library/app:1).
func ValidateRef(ref string) error {
	if ref == "" {
		return fmt.Errorf("no image reference to name the checkpoint image: %w", errdefs.ErrInvalidArgument)
	}
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	if named.String() != ref {
		return fmt.Errorf("image reference %q is not in full (nerdctl would look it up as %s): name it so: %w", ref, named, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Exported is a checkpoint image Export wrote (the CLI's --format json).
type Exported struct {
	Image          string `json:"image"`
	Digest         string `json:"digest"`
	Checkpoint     string `json:"checkpoint"`
	CheckpointName string `json:"checkpointName,omitempty"`
	Archive        string `json:"archive,omitempty"`
	ArchiveBytes   int64  `json:"archiveBytes,omitempty"`
	TookMs         int64  `json:"tookMs"`
}

// exporter makes checkpoint images in one containerd namespace.
type exporter struct {
	c         *Client
	progress  io.Writer
	base      string      // --base
	spec      *specs.Spec // ExportOptions.Spec
	mediaType string      // of the delta layers
}

// source is a checkpoint to export: its CRIU image directory and, for a CRI archive, the
// archive.
type source struct {
	criuDir string
	meta    checkpoint.Meta
	archive *export.Archive
	tmp     string // removed by close
	// stored: the shim stores this directory's memory as what changed since its parent's, in
	// the background after the checkpoint, and writes pagechain.ReportFile when done (a
	// checkpoint taken into a directory the shim was given: cklite's or the client's).
	stored bool
}

func (s source) close() {
	if s.tmp != "" {
		os.RemoveAll(s.tmp)
	}
}

// source finds what arg names: a CRI checkpoint archive, a CRIU image directory, a containerd
// checkpoint image (ctr containers checkpoint), or a checkpoint id whose image directory is
// known.
func (e *exporter) source(ctx context.Context, arg string) (src source, retErr error) {
	defer func() {
		if retErr != nil {
			src.close()
		}
	}()
	info, err := os.Stat(arg)
	switch {
	case err == nil && info.Mode().IsRegular():
		a, err := export.OpenArchive(arg, os.TempDir())
		if err != nil {
			return src, err
		}
		src.archive, src.criuDir, src.tmp = &a, a.CRIUDir(), a.Dir
	case err == nil && info.IsDir():
		src.criuDir = arg
	default:
		var tmp bool
		if src.criuDir, tmp, src.stored, err = e.checkpointDir(ctx, arg); err != nil {
			return src, err
		}
		if tmp {
			src.tmp = src.criuDir
		}
	}
	if src.meta, err = checkpoint.Read(src.criuDir); err != nil {
		return src, err
	}
	if !src.meta.Contents.HasMemory() || !src.meta.Contents.HasFS() {
		return src, fmt.Errorf("checkpoint %s holds %s: a checkpoint image needs both memory and filesystem: %w", src.meta.ID, src.meta.Contents, errdefs.ErrInvalidArgument)
	}
	return src, nil
}

// checkpointDir returns the CRIU image directory of checkpoint id (or unique id prefix) name,
// and whether the shim stores its memory as what changed (source.stored); or the CRIU images of
// the containerd checkpoint image name extracted into a temporary directory (tmp).
func (e *exporter) checkpointDir(ctx context.Context, name string) (dir string, tmp, stored bool, _ error) {
	tree, err := e.c.Tree(ctx, Filter{})
	if err != nil {
		return "", false, false, err
	}
	n, err := tree.Lookup(name)
	if err == nil {
		// The directory must still hold this checkpoint, not one written into it since.
		dir := ""
		if n.ImagePath == "" {
			dir = nerdctlImages(n.ID, "") // nerdctl checkpoint create records none
		}
		src, err := fork.SourceOf(n.Record, dir)
		if err != nil {
			return "", false, false, err
		}
		return src.ImageDir, false, n.ImagePath != "", nil
	}
	if !errdefs.IsNotFound(err) {
		return "", false, false, err
	}
	img, err := e.c.ctrd.ImageService().Get(ctx, name)
	if errdefs.IsNotFound(err) {
		return "", false, false, fmt.Errorf("%q is no checkpoint archive, image directory, checkpoint id or checkpoint image: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", false, false, fmt.Errorf("image %s: %w", name, err)
	}
	dir, err = export.OpenCheckpointImage(ctx, e.c.ctrd.ContentStore(), img.Name, img.Target, os.TempDir())
	return dir, err == nil, false, err
}

// memoryStoredWait bounds how long after its checkpoint an export waits for the shim to store the
// checkpoint's memory as what changed since its parent's (pkg/pagechain): the shim does it in the
// background, one checkpoint at a time, each in well under a second at 256 MiB here. A checkpoint
// older than that without a report was never deduplicated (a killed shim, a cklite before
// pagechain) and is exported as it is.
const memoryStoredWait = 2 * time.Minute

// waitMemoryStored waits until the shim has stored src's memory as what changed, if it does:
// exported before, the checkpoint's blob would be its full dump, which the shim then rewrites, so
// the next export of it, or of a checkpoint above it, would make and upload another blob.
func (e *exporter) waitMemoryStored(ctx context.Context, src source) error {
	deadline := src.meta.Created.Add(memoryStoredWait)
	if !src.stored || time.Now().After(deadline) {
		return nil
	}
	start := time.Now()
	ok, err := pagechain.WaitReport(ctx, src.criuDir, deadline)
	if err != nil {
		return fmt.Errorf("checkpoint %s: wait for its memory to be stored: %w", src.meta.ID, err)
	}
	if !ok {
		fmt.Fprintf(e.progress, "checkpoint %s: its memory is not stored as what changed %v after the checkpoint: exported as it is\n", src.meta.ID, memoryStoredWait)
	} else if waited := time.Since(start); waited > 100*time.Millisecond {
		fmt.Fprintf(e.progress, "checkpoint %s: waited %.1fs for its memory to be stored as what changed\n", src.meta.ID, waited.Seconds())
	}
	return nil
}

// export writes the checkpoint image of src into the content store and returns its record, named
// ref, not yet made (record). The content it wrote is left to containerd's collector (Export's
// lease holds it until it returns).
func (e *exporter) export(ctx context.Context, src source, ref string) (images.Image, error) {
	sn := e.c.ctrd.SnapshotService(src.meta.Snapshotter)
	chain, parent, err := e.chain(ctx, sn, src.meta)
	if err != nil {
		return images.Image{}, err
	}
	base, spec, err := e.origin(ctx, src)
	if err != nil {
		return images.Image{}, err
	}
	top, err := export.BaseChainID(ctx, e.c.ctrd.ContentStore(), base, platforms.Default())
	if err != nil {
		return images.Image{}, err
	}
	if parent != top.String() {
		return images.Image{}, fmt.Errorf("the frozen layers of checkpoint %s are stacked on snapshot %q, not on the layers of image %s (%s): name the container's image with --base: %w",
			src.meta.ID, parent, base.Name, top, errdefs.ErrFailedPrecondition)
	}
	if err := e.waitMemoryStored(ctx, src); err != nil {
		return images.Image{}, err
	}
	fmt.Fprintf(e.progress, "checkpoint %s of container %s: %d frozen layer(s) on image %s\n", src.meta.ID, src.meta.Container, len(chain), base.Name)
	deltas, err := export.Deltas(ctx, sn, e.c.ctrd.DiffService(), e.c.ctrd.ContentStore(), e.mediaType, parent, chain, e.progress)
	if err != nil {
		return images.Image{}, err
	}
	cs := e.c.ctrd.ContentStore()
	target, err := export.Write(ctx, cs, export.Spec{Base: base, Deltas: deltas, CRIUDir: src.criuDir, Meta: src.meta, Spec: spec})
	if err != nil {
		return images.Image{}, err
	}
	return images.Image{Name: ref, Target: target, Labels: map[string]string{ckimage.LabelCheckpoint: src.meta.ID}}, nil
}

// record makes img's record, or points the record of its name at it.
func (e *exporter) record(ctx context.Context, img images.Image) error {
	is := e.c.ctrd.ImageService()
	_, err := is.Create(ctx, img)
	if errdefs.IsAlreadyExists(err) {
		_, err = is.Update(ctx, img, "target", "labels."+ckimage.LabelCheckpoint)
	}
	if err != nil {
		return fmt.Errorf("image record %s: %w", img.Name, err)
	}
	return nil
}

// origin returns the image the checkpointed container was made from (--base, the container's,
// or the archive's) and its spec, when known (the container's, or the archive's spec.dump).
func (e *exporter) origin(ctx context.Context, src source) (images.Image, *specs.Spec, error) {
	name, spec := e.base, e.spec
	if src.archive != nil {
		spec = src.archive.Spec
		if name == "" {
			name = src.archive.Config.RootfsImageName
		}
	}
	c, err := e.c.ctrd.ContainerService().Get(ctx, src.meta.Container)
	switch {
	case err == nil:
		if name == "" {
			name = c.Image
		}
		if spec == nil && c.Spec != nil {
			spec = &specs.Spec{}
			if err := json.Unmarshal(c.Spec.GetValue(), spec); err != nil {
				return images.Image{}, nil, fmt.Errorf("spec of container %s: %w", c.ID, err)
			}
		}
	case !errdefs.IsNotFound(err):
		return images.Image{}, nil, fmt.Errorf("container %s of checkpoint %s: %w", src.meta.Container, src.meta.ID, err)
	}
	if name == "" {
		return images.Image{}, nil, fmt.Errorf("container %s of checkpoint %s is gone and its image is unknown: name it with --base: %w", src.meta.Container, src.meta.ID, errdefs.ErrNotFound)
	}
	img, err := e.c.ctrd.ImageService().Get(ctx, name)
	if err != nil {
		return images.Image{}, nil, fmt.Errorf("base image %s of checkpoint %s: %w", name, src.meta.ID, err)
	}
	return img, spec, nil
}

// chain returns the frozen layers holding the checkpoint's filesystem, bottom first, and the
// snapshot they are stacked on. Only the host that took the checkpoint has them: a cklite
// checkpoint's rootfs-diff.tar in a CRI archive is empty (the rw layer was frozen before
// containerd diffed it), so nothing else holds its files.
func (e *exporter) chain(ctx context.Context, sn snapshots.Snapshotter, meta checkpoint.Meta) ([]string, string, error) {
	_, err := sn.Stat(ctx, meta.Frozen)
	if errdefs.IsNotFound(err) && meta.Host != checkpoint.MachineID() {
		return nil, "", fmt.Errorf("checkpoint %s was taken on another host (machine id %s): its files are in frozen layer %s there; export it on that host: %w",
			meta.ID, meta.Host, meta.Frozen, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, "", fmt.Errorf("frozen layer %s of checkpoint %s: %w", meta.Frozen, meta.ID, err)
	}
	return export.Chain(ctx, sn, meta.Frozen)
}

// exportArchive writes image img (its record not made yet) as an OCI archive into f, which is
// renamed to final once complete, and returns its size.
func exportArchive(ctx context.Context, ctrd *containerd.Client, img images.Image, f *os.File, final string, progress io.Writer) (int64, error) {
	start := time.Now()
	path := f.Name()
	err := ctrd.Export(ctx, f, archive.WithImages([]images.Image{img}), archive.WithPlatform(platforms.DefaultStrict()))
	if err == nil {
		err = f.Sync() // complete on disk before it is renamed into place
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("export %s to %s: %w", img.Name, path, err)
	}
	info, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	fault.Point(fault.ExportArchive)
	if err := os.Rename(path, final); err != nil {
		return 0, fmt.Errorf("archive: %w", err)
	}
	fmt.Fprintf(progress, "archive %s: %d bytes (%.1fs)\n", final, info.Size(), time.Since(start).Seconds())
	return info.Size(), nil
}
