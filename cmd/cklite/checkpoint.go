package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/cklite/cklite/pkg/checkpoint"
	ckclient "github.com/cklite/cklite/pkg/client"
)

func checkpointListFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	out := outputFlags(fs, "the ids, oldest first")
	var filter ckclient.Filter
	fs.StringVar(&filter.Container, "container", "", "only the checkpoints of container `REF` (id, name or id prefix; also of a container that is gone, by id prefix)")
	var labels labelList
	fs.Var(&labels, "label", "only the checkpoints with label `KEY=VALUE` (repeatable: all of them)")
	return func(ctx context.Context, cli *cli, args []string) error {
		cl, err := cli.openNoArgs(ctx, fs, out, args)
		if err != nil {
			return err
		}
		defer cl.Close()
		filter.Labels = labels.m
		tree, err := cl.Tree(ctx, filter)
		if err != nil {
			return err
		}
		var records []checkpoint.Record
		for _, l := range tree.Lines() {
			records = append(records, l.Record)
		}
		records = oldestFirst(records)
		switch {
		case out.quiet:
			for _, r := range records {
				fmt.Fprintln(cli.stdout, r.ID)
			}
			return nil
		case out.json():
			v := newViewer(ctx, cl, cli).prefetch(records)
			views := make([]ckclient.Checkpoint, 0, len(records))
			for _, r := range records {
				views = append(views, v.view(r))
			}
			return printJSON(cli.stdout, views)
		}
		now := time.Now()
		if err := (lsView{tree: tree, describe: newViewer(ctx, cl, cli).prefetch(records).view, now: now}).write(cli.stdout); err != nil {
			return err
		}
		return listPods(ctx, cli, cl, filter, now)
	}
}

// listPods draws the pod checkpoints under the tree, for an unfiltered ls of CRI's namespace,
// where their members are.
func listPods(ctx context.Context, cli *cli, cl *ckclient.Client, filter ckclient.Filter, now time.Time) error {
	if cl.Namespace() != ckclient.CRINamespace || filter.Container != "" || len(filter.Labels) > 0 {
		return nil
	}
	pods, err := cl.PodCheckpoints(ctx)
	if err != nil {
		return err
	}
	if len(pods) > 0 {
		fmt.Fprintln(cli.stdout)
	}
	return writePodTable(cli.stdout, pods, now)
}

// oldestFirst sorts records by creation (the tree's lines are by parent first); the id breaks
// ties.
func oldestFirst(records []checkpoint.Record) []checkpoint.Record {
	slices.SortStableFunc(records, func(a, b checkpoint.Record) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID))
	})
	return records
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
		cl, tree, err := cli.checkpointsFor(ctx, args)
		if err != nil {
			return err
		}
		defer cl.Close()
		v := newViewer(ctx, cl, cli)
		var views []ckclient.Checkpoint
		err = eachCheckpoint(cli, args, func(ref string) error {
			n, err := tree.Lookup(ref)
			if err == nil {
				views = append(views, v.view(n.Record))
			}
			return err
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
	var opts ckclient.RemoveOptions
	fs.BoolVar(&opts.GC, "gc", false, "collect garbage before returning, so that the layers nothing else uses are freed now")
	fs.BoolVar(&opts.ImageDir, "image", false, "also remove the checkpoint's image directory (only if its cklite.json still names the checkpoint)")
	fs.BoolVar(&opts.Recursive, "recursive", false, "remove the checkpoint and every checkpoint below it (without it, its children move up under its parent)")
	fs.BoolVar(&opts.Recursive, "r", false, "short for --recursive")
	fs.BoolVar(&opts.Force, "force", false, "with -r: remove even a subtree that holds the current state of a running container")
	out := outputFlags(fs, "the ids removed (the default)")
	return func(ctx context.Context, cli *cli, args []string) error {
		if err := out.check(); err != nil {
			return err
		}
		if len(args) == 0 {
			return usageError("no checkpoint id given")
		}
		if opts.Force && !opts.Recursive {
			return usageError("--force goes with -r")
		}
		cl, err := cli.connect(ctx)
		if err != nil {
			return err
		}
		defer cl.Close()
		removed := []ckclient.Checkpoint{}
		err = eachCheckpoint(cli, args, func(ref string) error {
			gone, err := cl.Remove(ctx, ref, opts)
			for _, r := range gone {
				removed = append(removed, ckclient.Checkpoint{Meta: r.Meta, ImagePath: r.ImagePath})
				if !out.json() {
					fmt.Fprintln(cli.stdout, r.ID)
				}
			}
			return err
		})
		if out.json() {
			if perr := printJSON(cli.stdout, removed); perr != nil {
				return perr
			}
		}
		return err
	}
}

// checkpointsFor connects to containerd and reads the namespace's checkpoints, for commands
// that take checkpoint ids.
func (c *cli) checkpointsFor(ctx context.Context, ids []string) (*ckclient.Client, *ckclient.Tree, error) {
	if len(ids) == 0 {
		return nil, nil, usageError("no checkpoint id given")
	}
	cl, err := c.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	tree, err := cl.Tree(ctx, ckclient.Filter{})
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	return cl, tree, nil
}

// eachCheckpoint calls do for each checkpoint ref. A ref that names none, or whose do fails, is
// reported on stderr and the others are still done; the error then says how many failed.
func eachCheckpoint(cli *cli, refs []string, do func(ref string) error) error {
	failed := 0
	for _, ref := range refs {
		if err := do(ref); err != nil {
			fmt.Fprintf(cli.stderr, "cklite: %v\n", explain(err, cli.address))
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checkpoints failed", failed, len(refs))
	}
	return nil
}

// viewer describes checkpoints with the usage of their frozen layers. When cklite-snapshotter is
// down it says so once (on stderr) and asks no more.
type viewer struct {
	ctx  context.Context
	cl   *ckclient.Client
	cli  *cli
	mu   sync.Mutex
	down bool
	// views are what prefetch described, by checkpoint id.
	views map[string]ckclient.Checkpoint
}

func newViewer(ctx context.Context, cl *ckclient.Client, cli *cli) *viewer {
	return &viewer{ctx: ctx, cl: cl, cli: cli}
}

// describers is how many checkpoints prefetch describes at once. Each description waits on
// round trips (containerd, then the snapshotter's Usage) and on reading its image directories,
// ~3 ms apiece: one after the other, a listing of 90 took ~250 ms.
const describers = 8

// prefetch describes records, describers at a time, for view to answer from; the views are the
// same as view's own, in whatever order they complete.
func (vw *viewer) prefetch(records []checkpoint.Record) *viewer {
	views := make(map[string]ckclient.Checkpoint, len(records))
	var wg sync.WaitGroup
	var mu sync.Mutex
	slots := make(chan struct{}, describers)
	for _, r := range records {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer wg.Done()
			v := vw.view(r)
			<-slots
			mu.Lock()
			views[r.ID] = v
			mu.Unlock()
		}()
	}
	wg.Wait()
	vw.views = views
	return vw
}

// view describes r; a failure to read its layer's usage is logged and leaves Filesystem unset.
func (vw *viewer) view(r checkpoint.Record) ckclient.Checkpoint {
	if v, ok := vw.views[r.ID]; ok {
		return v
	}
	vw.mu.Lock()
	usage := !vw.down
	vw.mu.Unlock()
	v, err := vw.cl.Describe(vw.ctx, r, usage)
	if down, ok := snapshotterDown(err, vw.cli.address); ok {
		vw.mu.Lock()
		defer vw.mu.Unlock()
		if !vw.down {
			vw.down = true
			fmt.Fprintf(vw.cli.stderr, "cklite: warning: %v: sizes of frozen layers unknown\n", down)
		}
		return v
	}
	if err != nil {
		log.G(vw.ctx).WithError(err).WithField("checkpoint", r.ID).Warn("usage of the frozen layer")
	}
	return v
}
