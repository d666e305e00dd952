package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cklite/cklite/pkg/fork"
)

func forkFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	var opts fork.Options
	fs.IntVar(&opts.Count, "n", 1, "make `N` forks")
	fs.StringVar(&opts.Prefix, "prefix", "", "name the forks `PREFIX`-1 ... PREFIX-N (default: the checkpointed container's nerdctl name, or else its id, + \"-fork\")")
	imagePath := fs.String("image-path", "", "restore from the CRIU image directory `DIR` (default: the one the checkpoint was taken into); CHECKPOINT may then be left out")
	fs.StringVar(&opts.LogDir, "log-dir", "", "write each fork's stdout and stderr to `DIR`/ID.log (default: discard them)")
	fs.IntVar(&opts.Parallel, "parallel", 4, "start up to `N` forks at once")
	fs.BoolVar(&opts.CleanupOnError, "cleanup-on-error", false, "if a fork fails, remove the forks started (by default they stay; a failed fork never stops the others)")
	out := outputFlags(fs, "the ids of the forks running")
	fs.BoolVar(&opts.Network, "network", false, "give each fork the checkpointed container's networks, with an address of its own, as nerdctl gives a new container (default: loopback only; needs a container nerdctl made)")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) > 1 || (len(args) == 0 && *imagePath == "") {
			return usageError("want one CHECKPOINT, or --image-path")
		}
		if opts.Count < 1 {
			return usageError("-n %d: want at least one fork", opts.Count)
		}
		if opts.Parallel < 1 {
			return usageError("--parallel %d: want at least one", opts.Parallel)
		}
		if err := out.check(); err != nil {
			return err
		}
		if opts.LogDir != "" {
			dir, err := filepath.Abs(opts.LogDir)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("log directory: %w", err)
			}
			opts.LogDir = dir
		}
		cl, err := cli.connect(ctx)
		if err != nil {
			return err
		}
		defer cl.Close()
		ref := ""
		if len(args) == 1 {
			ref = args[0]
		}
		src, err := cl.Source(ctx, ref, *imagePath)
		if err != nil {
			return err
		}

		human := cli.stdout
		if !out.human() {
			human = io.Discard
		}
		fmt.Fprintf(human, "forking checkpoint %s into %s (images in %s)\n", src.Checkpoint.ID, forks(opts.Count), src.ImageDir)
		opts.Progress = func(f fork.Fork, err error) {
			if err != nil {
				fmt.Fprintf(human, "  %s failed: %v\n", f.Name, err)
				return
			}
			fmt.Fprintf(human, "  %s (%s) running, restored in %s\n", f.Name, f.ID[:12], f.Took.Round(time.Millisecond))
		}
		rep, err := cl.Fork(ctx, src, opts)
		if perr := printForks(cli, out, src.Checkpoint, rep); perr != nil {
			return perr
		}
		if err != nil {
			if len(rep.Failed) > 0 {
				fmt.Fprintf(cli.stderr, "%s of %d failed: %s\n", forks(len(rep.Failed)), opts.Count, strings.Join(rep.Failed, " "))
			}
			if len(rep.Removed) > 0 {
				fmt.Fprintf(cli.stderr, "removed the %s started: %s\n", forks(len(rep.Removed)), strings.Join(rep.Removed, " "))
			}
			if len(rep.Forks) > 0 {
				fmt.Fprintf(cli.stderr, "still running: %s (remove with nerdctl rm -f, or fork again with --cleanup-on-error)\n",
					strings.Join(forkNames(rep.Forks), " "))
			}
			return err
		}
		fmt.Fprintf(human, "%s running in %s (%s each on average)\n",
			forks(len(rep.Forks)), rep.Took.Round(time.Millisecond), (rep.Took / time.Duration(len(rep.Forks))).Round(time.Millisecond))
		return nil
	}
}

func forkNames(forks []fork.Fork) []string {
	names := make([]string, len(forks))
	for i, f := range forks {
		names[i] = f.Name
	}
	return names
}

func forks(n int) string {
	if n == 1 {
		return "1 fork"
	}
	return fmt.Sprintf("%d forks", n)
}
