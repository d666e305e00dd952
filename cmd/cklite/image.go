package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/platforms"

	"github.com/cklite/cklite/pkg/localimage"
)

// buildableImages are the images `cklite image build` makes, as pkg/localimage builds them for
// the tests: from Debian's archive, without a registry.
var buildableImages = map[string]func(ctx context.Context, cacheDir string, progress io.Writer) (localimage.Image, error){
	"busybox": localimage.Busybox, // a static busybox, about a second
	"sandbox": localimage.Sandbox, // Debian bookworm minbase with python3: debootstrap, a minute or two once
	"pause":   localimage.Pause,   // the CRI sandbox image a setup's containerd pins
}

func imageBuildFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	snapshotter := fs.String("snapshotter", envOr("CONTAINERD_SNAPSHOTTER", "cklite"), "unpack into `NAME`, so that the first container starts without unpacking (env CONTAINERD_SNAPSHOTTER); \"\" for none")
	out := outputFlags(fs, "the images' names (the default)")
	return func(ctx context.Context, cli *cli, args []string) error {
		names := slices.Sorted(maps.Keys(buildableImages))
		if len(args) == 0 {
			return usageError("name an image to build: %s", strings.Join(names, ", "))
		}
		for _, a := range args {
			if buildableImages[a] == nil {
				return usageError("no image %q to build: want %s", a, strings.Join(names, ", "))
			}
		}
		if err := out.check(); err != nil {
			return err
		}
		progress := progressTo(cli.stderr)
		built := []builtImage{}
		ctrd, ctx, err := cli.containerd(ctx)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		for _, a := range args {
			img, err := buildableImages[a](ctx, localimage.CacheDir(), progress)
			if err != nil {
				return err
			}
			if err := importImage(ctx, ctrd, img, *snapshotter, progress); err != nil {
				return err
			}
			if !out.json() {
				fmt.Fprintln(cli.stdout, img.Name)
			}
			built = append(built, builtImage{Image: img.Name, Archive: img.Archive, Snapshotter: *snapshotter})
		}
		if out.json() {
			return printJSON(cli.stdout, built)
		}
		return nil
	}
}

// builtImage is one image as image build --format json prints it.
type builtImage struct {
	Image       string `json:"image"`
	Archive     string `json:"archive"`               // the OCI archive it was imported from (cached)
	Snapshotter string `json:"snapshotter,omitempty"` // unpacked into it
}

// importImage imports img's archive into containerd and unpacks it into snapshotter.
func importImage(ctx context.Context, ctrd *client.Client, img localimage.Image, snapshotter string, progress io.Writer) error {
	f, err := os.Open(img.Archive)
	if err != nil {
		return err
	}
	defer f.Close()
	start := time.Now()
	imgs, err := ctrd.Import(ctx, f, client.WithImportPlatform(platforms.DefaultStrict()))
	if err != nil {
		return fmt.Errorf("import %s: %w", img.Archive, err)
	}
	for _, i := range imgs {
		if snapshotter == "" {
			continue
		}
		if err := client.NewImage(ctrd, i).Unpack(ctx, snapshotter); err != nil {
			return fmt.Errorf("unpack %s into %s: %w (is the snapshotter registered in containerd and running? cklite setup)", i.Name, snapshotter, err)
		}
	}
	fmt.Fprintf(progress, "imported %s (unpacked into %q) in %.1fs\n", img.Name, snapshotter, time.Since(start).Seconds())
	return nil
}
