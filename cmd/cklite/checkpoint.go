package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/docker/go-units"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/pagechain"
)

func checkpointListFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	out := outputFlags(fs, "the ids, oldest first")
	container := fs.String("container", "", "only the checkpoints of container `REF` (id, name or id prefix; also of a container that is gone, by id prefix)")
	var labels labelList
	fs.Var(&labels, "label", "only the checkpoints with label `KEY=VALUE` (repeatable: all of them)")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) > 0 {
			return usageError("checkpoint ls takes no arguments, got %q", args)
		}
		if err := out.check(); err != nil {
			return err
		}
		ctrd, ctx, records, err := cli.checkpoints(ctx)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		if records, err = filterRecords(ctx, ctrd, records, *container, labels.m); err != nil {
			return err
		}
		switch {
		case out.quiet:
			for _, r := range records {
				fmt.Fprintln(cli.stdout, r.ID)
			}
			return nil
		case out.json():
			v := newViewer(ctx, ctrd, cli)
			views := make([]checkpointView, 0, len(records))
			for _, r := range records {
				views = append(views, v.view(r))
			}
			return printJSON(cli.stdout, views)
		}
		v := newViewer(ctx, ctrd, cli)
		fsColumn := func(r checkpoint.Record) string { return fsSize(v.view(r)) }
		return writeTree(cli.stdout, checkpoint.NewTree(records), fsColumn, time.Now())
	}
}

// filterRecords keeps the records of container ref (if not "") that carry labels.
func filterRecords(ctx context.Context, ctrd *client.Client, records []checkpoint.Record, ref string, labels map[string]string) ([]checkpoint.Record, error) {
	id := ""
	if ref != "" {
		c, err := resolveContainer(ctx, ctrd, ref)
		switch {
		case err == nil:
			id = c.ID()
		case errdefs.IsNotFound(err):
			// A container that is gone: its checkpoints still name it.
			if id, err = gonePrefix(records, ref); err != nil {
				return nil, err
			}
		default:
			return nil, err
		}
	}
	var out []checkpoint.Record
	for _, r := range records {
		if (id == "" || r.Container == id) && r.HasLabels(labels) {
			out = append(out, r)
		}
	}
	return out, nil
}

// gonePrefix is the one container id among records' that starts with ref.
func gonePrefix(records []checkpoint.Record, ref string) (string, error) {
	ids := map[string]bool{}
	for _, r := range records {
		if strings.HasPrefix(r.Container, ref) {
			ids[r.Container] = true
		}
	}
	switch len(ids) {
	case 0:
		return "", fmt.Errorf("no container %q, and no checkpoint of a container whose id starts with it: %w", ref, errdefs.ErrNotFound)
	case 1:
		for id := range ids {
			return id, nil
		}
	}
	return "", fmt.Errorf("container id prefix %q is ambiguous: checkpoints of %s: %w", ref, strings.Join(slices.Sorted(maps.Keys(ids)), ", "), errdefs.ErrInvalidArgument)
}

// labelList is a repeatable KEY=VALUE flag.
type labelList struct{ m map[string]string }

func (l *labelList) String() string { return fmt.Sprint(l.m) }
func (l *labelList) Set(kv string) error {
	k, v, err := checkpoint.ParseLabel(kv)
	if err != nil {
		return err
	}
	if l.m == nil {
		l.m = map[string]string{}
	}
	l.m[k] = v
	return nil
}

func checkpointInspectFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	out := outputFlags(fs, "the full ids")
	return func(ctx context.Context, cli *cli, args []string) error {
		if out.format == "table" {
			out.format = "json" // inspect's table is JSON
		}
		if err := out.check(); err != nil {
			return err
		}
		ctrd, ctx, tree, err := cli.checkpointsFor(ctx, args)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		v := newViewer(ctx, ctrd, cli)
		var views []checkpointView
		err = eachCheckpoint(cli, tree, args, func(n *checkpoint.Node) error {
			views = append(views, v.view(n.Record))
			return nil
		})
		if len(views) > 0 {
			if out.quiet {
				for _, v := range views {
					fmt.Fprintln(cli.stdout, v.ID)
				}
			} else if perr := printJSON(cli.stdout, views); perr != nil {
				return perr
			}
		}
		return err
	}
}

func checkpointRemoveFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	gc := fs.Bool("gc", false, "collect garbage before returning, so that the layers nothing else uses are freed now")
	image := fs.Bool("image", false, "also remove the checkpoint's image directory (only if its cklite.json still names the checkpoint)")
	out := outputFlags(fs, "the ids removed (the default)")
	return func(ctx context.Context, cli *cli, args []string) error {
		if err := out.check(); err != nil {
			return err
		}
		ctrd, ctx, tree, err := cli.checkpointsFor(ctx, args)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		var opts []leases.DeleteOpt
		if *gc {
			opts = append(opts, leases.SynchronousDelete)
		}
		removed := []checkpointView{}
		err = eachCheckpoint(cli, tree, args, func(n *checkpoint.Node) error {
			if err := ctrd.LeasesService().Delete(ctx, leases.Lease{ID: checkpoint.LeaseID(n.ID)}, opts...); err != nil {
				return fmt.Errorf("delete lease: %w", err)
			}
			removed = append(removed, checkpointView{Meta: n.Meta, ImagePath: n.ImagePath})
			if *image {
				if err := removeImageDir(n.Record); err != nil {
					return fmt.Errorf("checkpoint removed, but not its image directory: %w", err)
				}
			}
			if !out.json() {
				fmt.Fprintln(cli.stdout, n.ID)
			}
			return nil
		})
		if out.json() {
			if perr := printJSON(cli.stdout, removed); perr != nil {
				return perr
			}
		}
		return err
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
		return nil, nil, nil, usageError("no checkpoint id given")
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
// cklite's. A directory already gone is fine. The image directories that read pages from it stay
// restorable.
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
	// Checkpoints whose memory is stored as what changed since this one's read pages from it:
	// those pages are copied into them first (pkg/pagechain).
	_, err = pagechain.Remove(r.ImagePath)
	return err
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

// viewer makes checkpointViews, asking the snapshotter for the usage of each frozen layer. When
// cklite-snapshotter is down it says so once (on stderr) and asks no more.
type viewer struct {
	ctx  context.Context
	ctrd *client.Client
	cli  *cli
	down bool
}

func newViewer(ctx context.Context, ctrd *client.Client, cli *cli) *viewer {
	return &viewer{ctx: ctx, ctrd: ctrd, cli: cli}
}

// view asks the snapshotter for the usage of r's frozen layer: its own files only, not its
// parents'. The cklite snapshotter computes it once per layer and caches it. A failure is logged
// and leaves Filesystem unset.
func (vw *viewer) view(r checkpoint.Record) checkpointView {
	v := checkpointView{Meta: r.Meta, ImagePath: r.ImagePath}
	if r.ImagePath != "" {
		// The image directory's cklite.json is the whole record (the lease's labels leave out
		// how CRIU dumped it).
		if m, err := checkpoint.Read(r.ImagePath); err == nil && m.ID == r.ID {
			v.Meta = m
		}
	}
	if !r.Contents.HasFS() || r.Frozen == "" || vw.down {
		return v
	}
	u, err := vw.ctrd.SnapshotService(r.Snapshotter).Usage(vw.ctx, r.Frozen)
	if down, ok := snapshotterDown(err, vw.cli.address); ok {
		vw.down = true
		fmt.Fprintf(vw.cli.stderr, "cklite: warning: %v: sizes of frozen layers unknown\n", down)
		return v
	}
	if err != nil {
		log.G(vw.ctx).WithError(err).WithField("checkpoint", r.ID).Warn("usage of the frozen layer")
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
