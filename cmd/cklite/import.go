package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	ckclient "github.com/cklite/cklite/pkg/client"
)

func checkpointImportFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	snapshotter := fs.String("snapshotter", "", "`NAME`: also unpack the image into this snapshotter (default: unpacked when a container is made from it)")
	out := outputFlags(fs, "the images' names")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) != 1 {
			return usageError("checkpoint import takes one archive, got %q", args)
		}
		cl, err := cli.open(ctx, out)
		if err != nil {
			return err
		}
		defer cl.Close()
		f, err := os.Open(args[0])
		if err != nil {
			return err
		}
		defer f.Close()
		start := time.Now()
		res, err := cl.Import(ctx, f, ckclient.ImportOptions{Snapshotter: *snapshotter})
		for _, r := range res {
			// An archive of anything else is imported all the same, but said so.
			if r.NotCheckpoint != nil {
				fmt.Fprintf(cli.stderr, "cklite: warning: %v\n", r.NotCheckpoint)
			}
			if !out.json() {
				fmt.Fprintln(cli.stdout, r.Image)
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", args[0], err)
		}
		fmt.Fprintf(progressTo(cli.stderr), "imported %d image(s) in %.1fs\n", len(res), time.Since(start).Seconds())
		if out.json() {
			return printJSON(cli.stdout, res)
		}
		return nil
	}
}
