package main

import (
	"context"
	"flag"
	"fmt"

	ckclient "github.com/cklite/cklite/pkg/client"
)

// dirList is a repeatable flag.
type dirList []string

func (d *dirList) String() string     { return fmt.Sprint(*d) }
func (d *dirList) Set(v string) error { *d = append(*d, v); return nil }

func checkpointPruneFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	var opts ckclient.PruneOptions
	fs.Var((*dirList)(&opts.Dirs), "dir", "a `DIR` whose subdirectories are checkpoint image directories that count as references (repeatable; default: nerdctl's checkpoints directory, <data_root>/checkpoints of its nerdctl.toml, when it exists)")
	fs.BoolVar(&opts.Unreferenced, "unreferenced", false, "also remove checkpoints with no recorded image directory that no checkpoint image and no --dir holds")
	fs.BoolVar(&opts.Orphaned, "orphaned", false, "also remove the checkpoints whose container is gone and that no container descends from (forked, restored or rolled back from), and in namespace k8s.io the volumes of pod forks whose pod is gone")
	fs.BoolVar(&opts.DryRun, "dry-run", false, "print what would be removed, remove nothing")
	fs.BoolVar(&opts.GC, "gc", false, "collect garbage before returning, so that the layers nothing else uses are freed now")
	out := outputFlags(fs, "the ids removed (with --dry-run: that would be)")
	return func(ctx context.Context, cli *cli, args []string) error {
		cl, err := cli.openNoArgs(ctx, fs, out, args)
		if err != nil {
			return err
		}
		defer cl.Close()
		res, total, err := cl.Prune(ctx, opts)
		switch {
		case out.quiet:
			for _, p := range res {
				if p.Checkpoint() {
					out.ids(cli.stdout, p.ID)
				}
			}
		case out.json():
			if perr := printJSON(cli.stdout, res); perr != nil {
				return perr
			}
		default:
			checkpoints := 0
			for _, p := range res {
				verb := "removed"
				if opts.DryRun {
					verb = "would remove"
				}
				what := p.ID
				switch {
				case p.ImageDir != "":
					what = "image directory " + p.ImageDir
				case p.ForkVolumes != "":
					what = "pod fork volumes " + p.ForkVolumes
				default:
					checkpoints++
				}
				fmt.Fprintf(cli.stdout, "%s %s: %s\n", verb, what, p.Reason)
			}
			if !opts.DryRun && err == nil {
				fmt.Fprintf(cli.stdout, "%d of %d checkpoints removed\n", checkpoints, total)
			}
		}
		return err
	}
}
