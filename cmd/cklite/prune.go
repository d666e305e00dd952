package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// defaultNerdctlCheckpoints is where nerdctl keeps `nerdctl checkpoint create`'s directories
// (<data-root>/checkpoints/NAME), for its default data root.
const defaultNerdctlCheckpoints = "/var/lib/nerdctl/checkpoints"

// dirList is a repeatable flag.
type dirList []string

func (d *dirList) String() string     { return fmt.Sprint(*d) }
func (d *dirList) Set(v string) error { *d = append(*d, v); return nil }

func checkpointPruneFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	var dirs dirList
	fs.Var(&dirs, "dir", "a `DIR` whose subdirectories are checkpoint image directories that count as references (repeatable; "+defaultNerdctlCheckpoints+" when it exists)")
	unreferenced := fs.Bool("unreferenced", false, "also remove checkpoints with no recorded image directory that no checkpoint image and no --dir holds")
	dryRun := fs.Bool("dry-run", false, "print what would be removed, remove nothing")
	gc := fs.Bool("gc", false, "collect garbage before returning, so that the layers nothing else uses are freed now")
	out := outputFlags(fs, "the ids removed (with --dry-run: that would be)")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) > 0 {
			return usageError("checkpoint prune takes no arguments, got %q", args)
		}
		if err := out.check(); err != nil {
			return err
		}
		if len(dirs) == 0 {
			if _, err := os.Stat(defaultNerdctlCheckpoints); err == nil {
				dirs = append(dirs, defaultNerdctlCheckpoints)
			}
		}
		ctrd, ctx, records, err := cli.checkpoints(ctx)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		held, err := heldCheckpoints(ctx, ctrd, dirs)
		if err != nil {
			return err
		}
		var opts []leases.DeleteOpt
		if *gc {
			opts = append(opts, leases.SynchronousDelete)
		}
		human := cli.stdout
		if !out.human() {
			human = io.Discard
		}
		res := []pruned{}
		for _, r := range records {
			why, prune := pruneReason(r, held, *unreferenced)
			if !prune {
				continue
			}
			res = append(res, pruned{ID: r.ID, Name: r.Name, Container: r.Container, Reason: why})
			if *dryRun {
				fmt.Fprintf(human, "would remove %s: %s\n", r.ID, why)
				continue
			}
			if err := ctrd.LeasesService().Delete(ctx, leases.Lease{ID: checkpoint.LeaseID(r.ID)}, opts...); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("remove checkpoint %s: %w", r.ID, err)
			}
			res[len(res)-1].Removed = true
			fmt.Fprintf(human, "removed %s: %s\n", r.ID, why)
		}
		switch {
		case out.quiet:
			for _, p := range res {
				out.ids(cli.stdout, p.ID)
			}
		case out.json():
			return printJSON(cli.stdout, res)
		case !*dryRun:
			fmt.Fprintf(cli.stdout, "%d of %d checkpoints removed\n", len(res), len(records))
		}
		return nil
	}
}

// pruned is one checkpoint as checkpoint prune --format json prints it.
type pruned struct {
	ID        string `json:"id"`
	Name      string `json:"name,omitempty"`
	Container string `json:"container"`
	Reason    string `json:"reason"`
	Removed   bool   `json:"removed"` // false with --dry-run
}

// pruneReason says why r goes, or that it stays: its recorded image directory no longer holds it,
// or (with unreferenced) nothing is known to hold it.
func pruneReason(r checkpoint.Record, held map[string]string, unreferenced bool) (string, bool) {
	if r.ImagePath != "" {
		m, err := checkpoint.Read(r.ImagePath)
		switch {
		case err == nil && m.ID == r.ID:
			return "", false
		case err == nil:
			return fmt.Sprintf("its image directory %s now holds checkpoint %s", r.ImagePath, m.ID), true
		case errdefs.IsNotFound(err) || os.IsNotExist(err):
			return fmt.Sprintf("its image directory %s is gone", r.ImagePath), true
		default:
			return "", false // unreadable is not gone
		}
	}
	if _, ok := held[r.ID]; ok || !unreferenced {
		return "", false
	}
	return "no image directory or checkpoint image holds it", true
}

// heldCheckpoints maps the ids of the checkpoints that checkpoint images in the namespace and
// image directories below dirs hold to where they are.
func heldCheckpoints(ctx context.Context, ctrd *client.Client, dirs []string) (map[string]string, error) {
	held := map[string]string{}
	imgs, err := ctrd.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	for _, img := range imgs {
		m, err := checkpoint.FromImage(ctx, ctrd.ContentStore(), img.Target)
		if err == nil {
			held[m.ID] = "image " + img.Name
		}
	}
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("--dir: %w", err)
		}
		for _, e := range entries {
			sub := filepath.Join(dir, e.Name())
			if m, err := checkpoint.Read(sub); err == nil {
				held[m.ID] = sub
			}
		}
	}
	return held, nil
}
