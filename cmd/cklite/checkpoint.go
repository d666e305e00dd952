package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/docker/go-units"

	"github.com/cklite/cklite/pkg/checkpoint"
)

func checkpointListFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	quiet := fs.Bool("quiet", false, "print only the ids, oldest first")
	fs.BoolVar(quiet, "q", false, "short for --quiet")
	format := fs.String("format", "table", "`FORMAT`: table (a tree) or json (the checkpoints, oldest first)")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("checkpoint ls takes no arguments, got %q: %w", args, errdefs.ErrInvalidArgument)
		}
		if *format != "table" && *format != "json" {
			return fmt.Errorf("format %q: want table or json: %w", *format, errdefs.ErrInvalidArgument)
		}
		ctrd, ctx, records, err := cli.checkpoints(ctx)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		switch {
		case *quiet:
			for _, r := range records {
				fmt.Fprintln(cli.stdout, r.ID)
			}
			return nil
		case *format == "json":
			views := make([]checkpointView, 0, len(records))
			for _, r := range records {
				views = append(views, viewOf(ctx, ctrd, r))
			}
			return printJSON(cli.stdout, views)
		}
		fsColumn := func(r checkpoint.Record) string { return fsSize(viewOf(ctx, ctrd, r)) }
		return writeTree(cli.stdout, checkpoint.NewTree(records), fsColumn, time.Now())
	}
}

func checkpointInspectFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	return func(ctx context.Context, cli *cli, args []string) error {
		ctrd, ctx, tree, err := cli.checkpointsFor(ctx, args)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		var views []checkpointView
		err = eachCheckpoint(cli, tree, args, func(n *checkpoint.Node) error {
			views = append(views, viewOf(ctx, ctrd, n.Record))
			return nil
		})
		if len(views) > 0 {
			if perr := printJSON(cli.stdout, views); perr != nil {
				return perr
			}
		}
		return err
	}
}

func checkpointRemoveFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	gc := fs.Bool("gc", false, "collect garbage before returning, so that the layers nothing else uses are freed now")
	image := fs.Bool("image", false, "also remove the checkpoint's image directory (only if its cklite.json still names the checkpoint)")
	return func(ctx context.Context, cli *cli, args []string) error {
		ctrd, ctx, tree, err := cli.checkpointsFor(ctx, args)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		var opts []leases.DeleteOpt
		if *gc {
			opts = append(opts, leases.SynchronousDelete)
		}
		return eachCheckpoint(cli, tree, args, func(n *checkpoint.Node) error {
			if err := ctrd.LeasesService().Delete(ctx, leases.Lease{ID: checkpoint.LeaseID(n.ID)}, opts...); err != nil {
				return fmt.Errorf("delete lease: %w", err)
			}
			if *image {
				if err := removeImageDir(n.Record); err != nil {
					return fmt.Errorf("checkpoint removed, but not its image directory: %w", err)
				}
			}
			fmt.Fprintln(cli.stdout, n.ID)
			return nil
		})
	}
}

// checkpoints connects to containerd and reads the namespace's checkpoints, oldest first.
func (c *cli) checkpoints(ctx context.Context) (*client.Client, context.Context, []checkpoint.Record, error) {
	ctrd, ctx, err := c.connect(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	records, err := checkpoint.List(ctx, ctrd.LeasesService(), c.namespace)
	if err != nil {
		ctrd.Close()
		return nil, nil, nil, err
	}
	return ctrd, ctx, records, nil
}

// checkpointsFor is checkpoints as a tree, for commands that take checkpoint ids.
func (c *cli) checkpointsFor(ctx context.Context, ids []string) (*client.Client, context.Context, *checkpoint.Tree, error) {
	if len(ids) == 0 {
		return nil, nil, nil, fmt.Errorf("no checkpoint id given: %w", errdefs.ErrInvalidArgument)
	}
	ctrd, ctx, records, err := c.checkpoints(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	return ctrd, ctx, checkpoint.NewTree(records), nil
}

// eachCheckpoint calls do for the checkpoint of each id (or unique id prefix). An id that names
// none, or whose do fails, is reported on stderr and the others are still done; the error then
// says how many failed.
func eachCheckpoint(cli *cli, tree *checkpoint.Tree, ids []string, do func(*checkpoint.Node) error) error {
	failed := 0
	for _, id := range ids {
		n, err := tree.Lookup(id)
		if err == nil {
			if err = do(n); err != nil {
				err = fmt.Errorf("checkpoint %s: %w", n.ID, err)
			}
		}
		if err != nil {
			fmt.Fprintf(cli.stderr, "cklite: %v\n", err)
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checkpoints failed", failed, len(ids))
	}
	return nil
}

// removeImageDir removes the image directory r recorded, but only while its metadata file still
// names r: the directory may have been reused for another checkpoint, or may never have been
// cklite's. A directory already gone is fine.
func removeImageDir(r checkpoint.Record) error {
	if r.ImagePath == "" {
		return nil
	}
	if _, err := os.Stat(r.ImagePath); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	m, err := checkpoint.Read(r.ImagePath)
	if err != nil {
		return fmt.Errorf("left %s: %w", r.ImagePath, err)
	}
	if m.ID != r.ID {
		return fmt.Errorf("left %s: it now holds checkpoint %s: %w", r.ImagePath, m.ID, errdefs.ErrFailedPrecondition)
	}
	return os.RemoveAll(r.ImagePath)
}

// checkpointView is a checkpoint as inspect and ls --format json print it: its record and the
// disk usage of its frozen layer.
type checkpointView struct {
	checkpoint.Meta
	ImagePath  string   `json:"imagePath,omitempty"`
	Filesystem *fsUsage `json:"filesystem,omitempty"`
}

type fsUsage struct {
	Bytes  int64 `json:"bytes"`
	Inodes int64 `json:"inodes"`
}

// viewOf asks the snapshotter for the usage of r's frozen layer: its own files only, not its
// parents'. The cklite snapshotter computes it once per layer and caches it. A failure is logged
// and leaves Filesystem unset.
func viewOf(ctx context.Context, ctrd *client.Client, r checkpoint.Record) checkpointView {
	v := checkpointView{Meta: r.Meta, ImagePath: r.ImagePath}
	if r.ImagePath != "" {
		// The image directory's cklite.json is the whole record (the lease's labels leave out
		// how CRIU dumped it).
		if m, err := checkpoint.Read(r.ImagePath); err == nil && m.ID == r.ID {
			v.Meta = m
		}
	}
	if !r.Contents.HasFS() || r.Frozen == "" {
		return v
	}
	u, err := ctrd.SnapshotService(r.Snapshotter).Usage(ctx, r.Frozen)
	if err != nil {
		log.G(ctx).WithError(err).WithField("checkpoint", r.ID).Warn("usage of the frozen layer")
		return v
	}
	v.Filesystem = &fsUsage{Bytes: u.Size, Inodes: u.Inodes}
	return v
}

// fsSize is the FILESYSTEM column: "-" without a frozen layer, "?" when its usage is unknown.
func fsSize(v checkpointView) string {
	switch {
	case !v.Contents.HasFS():
		return "-"
	case v.Filesystem == nil:
		return "?"
	}
	return units.HumanSize(float64(v.Filesystem.Bytes))
}

// writeTree prints the tree as a table; fsColumn gives a checkpoint's FILESYSTEM column.
func writeTree(w io.Writer, tree *checkpoint.Tree, fsColumn func(checkpoint.Record) string, now time.Time) error {
	tw := tabwriter.NewWriter(w, 4, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCONTAINER\tCONTENTS\tCREATED\tMEMORY\tFILESYSTEM\tEXPIRES\tIMAGE PATH")
	for _, l := range tree.Lines() {
		id := l.Indent + l.ID
		if l.Orphan {
			id += " (parent " + l.Parent + " gone)"
		}
		memory := "-"
		if l.Contents.HasMemory() {
			memory = units.HumanSize(float64(l.MemoryBytes))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", id, l.Container, l.Contents,
			units.HumanDuration(now.Sub(l.Created))+" ago", memory, fsColumn(l.Record), expires(l.Expires, now), orDash(l.ImagePath))
	}
	return tw.Flush()
}

// expires is the EXPIRES column. A checkpoint past its expiry is still listed until containerd's
// garbage collector next runs.
func expires(at, now time.Time) string {
	switch {
	case at.IsZero():
		return "never"
	case !at.After(now):
		return "expired"
	}
	return "in " + units.HumanDuration(at.Sub(now))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
