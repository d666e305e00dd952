package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"

	"github.com/cklite/cklite/pkg/ckimage"
)

func checkpointImportFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	snapshotter := fs.String("snapshotter", "", "`NAME`: also unpack the image into this snapshotter (default: unpacked when a container is made from it)")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("checkpoint import takes one archive, got %q: %w", args, errdefs.ErrInvalidArgument)
		}
		ctrd, ctx, err := cli.connect(ctx)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		f, err := os.Open(args[0])
		if err != nil {
			return err
		}
		defer f.Close()
		start := time.Now()
		imgs, err := ctrd.Import(ctx, f, client.WithImportPlatform(platforms.DefaultStrict()))
		if err != nil {
			return fmt.Errorf("import %s: %w", args[0], err)
		}
		for _, i := range imgs {
			// An archive of anything else is imported all the same, but said so.
			if _, err := ckimage.Find(ctx, ctrd.ContentStore(), i.Name, i.Target, platforms.Default()); err != nil {
				fmt.Fprintf(cli.stderr, "cklite: warning: %v\n", err)
			}
			if *snapshotter != "" {
				if err := client.NewImage(ctrd, i).Unpack(ctx, *snapshotter); err != nil {
					return fmt.Errorf("unpack %s into %s: %w", i.Name, *snapshotter, err)
				}
			}
			fmt.Fprintln(cli.stdout, i.Name)
		}
		fmt.Fprintf(cli.stderr, "imported %d image(s) in %.1fs\n", len(imgs), time.Since(start).Seconds())
		return nil
	}
}
