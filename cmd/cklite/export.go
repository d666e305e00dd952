package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/ckimage"
	"github.com/cklite/cklite/pkg/ckimage/export"
	"github.com/cklite/cklite/pkg/fork"
)

func checkpointExportFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	ref := fs.String("ref", "", "`REF`: name of the checkpoint image in containerd (push it with nerdctl push or ctr images push)")
	archiveTo := fs.String("o", "", "`FILE`: also write the image as an OCI archive (cklite checkpoint import, ctr images import)")
	compression := fs.String("compression", "zstd", "`KIND` of the delta layers: zstd (fast), gzip (any client) or none")
	base := fs.String("base", "", "`IMAGE` the checkpointed container ran; default: the container's image, or the archive's")
	out := outputFlags(fs, "the image's name")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) != 1 {
			return usageError("checkpoint export takes one checkpoint (id, name, image directory or CRI archive), got %q", args)
		}
		if *ref == "" {
			return usageError("--ref names the image to write")
		}
		if err := out.check(); err != nil {
			return err
		}
		mediaType, err := export.LayerMediaType(*compression)
		if err != nil {
			return err
		}
		ctrd, ctx, err := cli.containerd(ctx)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		ctx, done, err := ctrd.WithLease(ctx, leases.WithExpiration(time.Hour))
		if err != nil {
			return err
		}
		defer done(context.WithoutCancel(ctx)) //nolint:errcheck
		progress := progressTo(cli.stderr)
		e := &exporter{ctrd: ctrd, namespace: cli.namespace, progress: progress, base: *base, mediaType: mediaType}
		src, err := e.source(ctx, args[0])
		if err != nil {
			return err
		}
		defer src.close()
		start := time.Now()
		img, err := e.export(ctx, src, *ref)
		if err != nil {
			return err
		}
		fmt.Fprintf(progress, "image %s: %s (%.1fs)\n", img.Name, img.Target.Digest, time.Since(start).Seconds())
		res := exported{Image: img.Name, Digest: img.Target.Digest.String(), Checkpoint: src.meta.ID, CheckpointName: src.meta.Name}
		if *archiveTo != "" {
			if res.ArchiveBytes, err = exportArchive(ctx, ctrd, img.Name, *archiveTo, progress); err != nil {
				return err
			}
			res.Archive = *archiveTo
		}
		res.TookMs = time.Since(start).Milliseconds()
		if out.json() {
			return printJSON(cli.stdout, res)
		}
		fmt.Fprintln(cli.stdout, img.Name)
		return nil
	}
}

// exported is what checkpoint export --format json prints.
type exported struct {
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
	ctrd      *client.Client
	namespace string
	progress  io.Writer
	base      string // --base
	mediaType string // of the delta layers
}

// source is a checkpoint to export: its CRIU image directory and, for a CRI archive, the
// archive.
type source struct {
	criuDir string
	meta    checkpoint.Meta
	archive *export.Archive
	tmp     string // removed by close
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
		if src.criuDir, tmp, err = e.checkpointDir(ctx, arg); err != nil {
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
// or the CRIU images of the containerd checkpoint image name extracted into a temporary
// directory (tmp).
func (e *exporter) checkpointDir(ctx context.Context, name string) (dir string, tmp bool, _ error) {
	recs, err := checkpoint.List(ctx, e.ctrd.LeasesService(), e.namespace)
	if err != nil {
		return "", false, err
	}
	n, err := checkpoint.NewTree(recs).Lookup(name)
	if err == nil {
		// The directory must still hold this checkpoint, not one written into it since.
		src, err := fork.SourceOf(n.Record, "")
		if err != nil {
			return "", false, err
		}
		return src.ImageDir, false, nil
	}
	if !errdefs.IsNotFound(err) {
		return "", false, err
	}
	img, err := e.ctrd.ImageService().Get(ctx, name)
	if errdefs.IsNotFound(err) {
		return "", false, fmt.Errorf("%q is no checkpoint archive, image directory, checkpoint id or checkpoint image: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", false, fmt.Errorf("image %s: %w", name, err)
	}
	dir, err = export.OpenCheckpointImage(ctx, e.ctrd.ContentStore(), img.Name, img.Target, os.TempDir())
	return dir, err == nil, err
}

// export writes the checkpoint image of src and names it ref.
func (e *exporter) export(ctx context.Context, src source, ref string) (images.Image, error) {
	sn := e.ctrd.SnapshotService(src.meta.Snapshotter)
	chain, parent, err := e.chain(ctx, sn, src.meta)
	if err != nil {
		return images.Image{}, err
	}
	base, spec, err := e.origin(ctx, src)
	if err != nil {
		return images.Image{}, err
	}
	top, err := export.BaseChainID(ctx, e.ctrd.ContentStore(), base, platforms.Default())
	if err != nil {
		return images.Image{}, err
	}
	if parent != top.String() {
		return images.Image{}, fmt.Errorf("the frozen layers of checkpoint %s are stacked on snapshot %q, not on the layers of image %s (%s): name the container's image with --base: %w",
			src.meta.ID, parent, base.Name, top, errdefs.ErrFailedPrecondition)
	}
	fmt.Fprintf(e.progress, "checkpoint %s of container %s: %d frozen layer(s) on image %s\n", src.meta.ID, src.meta.Container, len(chain), base.Name)
	deltas, err := export.Deltas(ctx, sn, e.ctrd.DiffService(), e.ctrd.ContentStore(), e.mediaType, parent, chain, e.progress)
	if err != nil {
		return images.Image{}, err
	}
	cs := e.ctrd.ContentStore()
	target, err := export.Write(ctx, cs, export.Spec{Base: base, Deltas: deltas, CRIUDir: src.criuDir, Meta: src.meta, Spec: spec})
	if err != nil {
		return images.Image{}, err
	}
	is := e.ctrd.ImageService()
	img := images.Image{Name: ref, Target: target, Labels: map[string]string{ckimage.LabelCheckpoint: src.meta.ID}}
	created, err := is.Create(ctx, img)
	if errdefs.IsAlreadyExists(err) {
		created, err = is.Update(ctx, img, "target", "labels."+ckimage.LabelCheckpoint)
	}
	if err != nil {
		return images.Image{}, fmt.Errorf("image record %s: %w", ref, err)
	}
	return created, nil
}

// origin returns the image the checkpointed container was made from (--base, the container's,
// or the archive's) and its spec, when known (the container's, or the archive's spec.dump).
func (e *exporter) origin(ctx context.Context, src source) (images.Image, *specs.Spec, error) {
	name := e.base
	var spec *specs.Spec
	if src.archive != nil {
		spec = src.archive.Spec
		if name == "" {
			name = src.archive.Config.RootfsImageName
		}
	}
	c, err := e.ctrd.ContainerService().Get(ctx, src.meta.Container)
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
	img, err := e.ctrd.ImageService().Get(ctx, name)
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

// exportArchive writes image name as an OCI archive to path and returns its size.
func exportArchive(ctx context.Context, ctrd *client.Client, name, path string, progress io.Writer) (int64, error) {
	start := time.Now()
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	err = ctrd.Export(ctx, f, archive.WithImage(ctrd.ImageService(), name), archive.WithPlatform(platforms.DefaultStrict()))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return 0, fmt.Errorf("export %s to %s: %w", name, path, err)
	}
	info, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(progress, "archive %s: %d bytes (%.1fs)\n", path, info.Size(), time.Since(start).Seconds())
	return info.Size(), nil
}
