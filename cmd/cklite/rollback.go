package main

import (
	"context"
	"flag"

	ckclient "github.com/cklite/cklite/pkg/client"
)

func rollbackFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	var opts ckclient.RollbackOptions
	fs.StringVar(&opts.ImagePath, "image-path", "", "roll back to the checkpoint in the CRIU image directory `DIR` (default: the one CHECKPOINT was taken into); CHECKPOINT may then be left out")
	out := outputFlags(fs, "the container's id")
	fs.BoolVar(&opts.ForceForeign, "force-foreign", false, "roll back even to a checkpoint outside the container's lineage (taken of another container that it was not forked or restored from): that container's memory and files replace this one's")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) < 1 || len(args) > 2 || (len(args) == 1 && opts.ImagePath == "") {
			return usageError("want CONTAINER and CHECKPOINT, or CONTAINER and --image-path")
		}
		cl, err := cli.open(ctx, out)
		if err != nil {
			return err
		}
		defer cl.Close()
		ref := ""
		if len(args) == 2 {
			ref = args[1]
		}
		opts.Progress = progressTo(cli.stderr)
		rb, err := cl.Rollback(ctx, args[0], ref, opts)
		if err != nil {
			return err
		}
		return printRollback(cli, out, rb)
	}
}
