package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/cklite/cklite/pkg/ckimage/export"
	ckclient "github.com/cklite/cklite/pkg/client"
)

func checkpointExportFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	ref := fs.String("ref", "", "`REF`: name of the checkpoint image in containerd (push it with nerdctl push or ctr images push)")
	archiveTo := fs.String("o", "", "`FILE`: also write the image as an OCI archive (cklite checkpoint import, ctr images import)")
	compression := fs.String("compression", "zstd", "`KIND` of the delta layers: zstd (fast), gzip (any client) or none")
	base := fs.String("base", "", "`IMAGE` the checkpointed container ran; default: the container's image, or the archive's")
	out := outputFlags(fs, "the image's name")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) != 1 {
			return usageError("checkpoint export takes one checkpoint (id, name, image directory or CRI archive), got %q", args)
		}
		if *ref == "" {
			return usageError("--ref names the image to write")
		}
		if err := ckclient.ValidateRef(*ref); err != nil {
			return usageErr{err}
		}
		if err := out.check(); err != nil {
			return err
		}
		if _, err := export.LayerMediaType(*compression); err != nil {
			return usageErr{err}
		}
		cl, err := cli.connect(ctx)
		if err != nil {
			return err
		}
		defer cl.Close()
		res, err := cl.Export(ctx, args[0], ckclient.ExportOptions{
			Ref: *ref, Archive: *archiveTo, Compression: *compression, Base: *base, Progress: progressTo(cli.stderr),
		})
		if err != nil {
			return err
		}
		if out.json() {
			return printJSON(cli.stdout, res)
		}
		fmt.Fprintln(cli.stdout, res.Image)
		return nil
	}
}
