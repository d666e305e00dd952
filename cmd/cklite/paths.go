package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/cklite/cklite/pkg/config"
)

// pathsReport is what `cklite paths` prints.
type pathsReport struct {
	Address     string `json:"address"`
	UUID        string `json:"uuid"`
	ShimConfig  string `json:"shim_config"`
	StateDir    string `json:"state_dir"`
	Checkpoints string `json:"checkpoints"`
	ImageCache  string `json:"image_cache"`
}

func pathsFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	out := outputFlags(fs, "the namespace's checkpoints directory")
	return func(ctx context.Context, cli *cli, args []string) error {
		cl, err := cli.openNoArgs(ctx, fs, out, args)
		if err != nil {
			return err
		}
		defer cl.Close()
		inst, err := cl.Paths(ctx)
		if err != nil {
			return err
		}
		checkpoints, err := inst.NamespaceCheckpoints(cli.namespace)
		if err != nil {
			return err
		}
		r := pathsReport{Address: cli.address, UUID: inst.UUID, ShimConfig: config.ShimConfigPath(), StateDir: inst.Dir, Checkpoints: checkpoints, ImageCache: inst.ImageCache()}
		switch {
		case out.quiet:
			out.ids(cli.stdout, r.Checkpoints)
			return nil
		case out.json():
			return printJSON(cli.stdout, r)
		}
		for _, row := range [][2]string{
			{"containerd", fmt.Sprintf("%s (UUID %s)", r.Address, r.UUID)},
			{"configuration", r.ShimConfig},
			{"state", r.StateDir},
			{"checkpoints", r.Checkpoints},
			{"image cache", r.ImageCache},
		} {
			fmt.Fprintf(cli.stdout, "%-14s %s\n", row[0], row[1])
		}
		return nil
	}
}
