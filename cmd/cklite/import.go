package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/platforms"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/ckimage"
)

func checkpointImportFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	snapshotter := fs.String("snapshotter", "", "`NAME`: also unpack the image into this snapshotter (default: unpacked when a container is made from it)")
	out := outputFlags(fs, "the images' names")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) != 1 {
			return usageError("checkpoint import takes one archive, got %q", args)
		}
		if err := out.check(); err != nil {
			return err
		}
		ctrd, ctx, err := cli.containerd(ctx)
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
		res := []imported{}
		for _, i := range imgs {
			// An archive of anything else is imported all the same, but said so.
			r := imported{Image: i.Name, Digest: i.Target.Digest.String()}
			if _, err := ckimage.Find(ctx, ctrd.ContentStore(), i.Name, i.Target, platforms.Default()); err != nil {
				fmt.Fprintf(cli.stderr, "cklite: warning: %v\n", err)
			} else if m, err := checkpoint.FromImage(ctx, ctrd.ContentStore(), i.Target); err == nil {
				r.Checkpoint, r.CheckpointName = m.ID, m.Name
			}
			res = append(res, r)
			if *snapshotter != "" {
				if err := client.NewImage(ctrd, i).Unpack(ctx, *snapshotter); err != nil {
					return fmt.Errorf("unpack %s into %s: %w", i.Name, *snapshotter, err)
				}
			}
			if !out.json() {
				fmt.Fprintln(cli.stdout, i.Name)
			}
		}
		fmt.Fprintf(progressTo(cli.stderr), "imported %d image(s) in %.1fs\n", len(imgs), time.Since(start).Seconds())
		if out.json() {
			return printJSON(cli.stdout, res)
		}
		return nil
	}
}

// imported is one image as checkpoint import --format json prints it.
type imported struct {
	Image          string `json:"image"`
	Digest         string `json:"digest"`
	Checkpoint     string `json:"checkpoint,omitempty"` // "" for an image that holds no checkpoint
	CheckpointName string `json:"checkpointName,omitempty"`
}
