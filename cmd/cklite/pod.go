package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/docker/go-units"

	ckclient "github.com/cklite/cklite/pkg/client"
	"github.com/cklite/cklite/pkg/podckpt"
)

// The pod commands work on CRI's pods, in containerd's namespace k8s.io whatever -n says
// (pkg/podckpt has the design).

func podCheckpointFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	var opts ckclient.PodCheckpointOptions
	fs.Var((*dirList)(&opts.Volumes), "volume", "also capture host directory `DIR`, which the pod's containers mount, as one of its emptyDirs (repeatable; the kubelet's emptyDirs are found from the mounts)")
	out := outputFlags(fs, "the pod checkpoint's id")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) != 1 {
			return usageError("want one POD (sandbox id or prefix, NAME or NAMESPACE/NAME)")
		}
		cl, err := cli.open(ctx, out)
		if err != nil {
			return err
		}
		defer cl.Close()
		opts.Progress = progressTo(cli.stderr)
		rec, err := cl.PodCheckpoint(ctx, args[0], opts)
		if err != nil {
			return err
		}
		switch {
		case out.quiet:
			out.ids(cli.stdout, rec.ID)
			return nil
		case out.json():
			return printJSON(cli.stdout, podJSON(rec))
		}
		fmt.Fprintf(cli.stdout, "pod checkpoint %s of %s: %d containers, %d volumes, frozen %d ms\n", rec.ID, rec.Pod, len(rec.Members), len(rec.Volumes), rec.FrozenMs)
		return nil
	}
}

func podListFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	out := outputFlags(fs, "the ids, oldest first")
	return func(ctx context.Context, cli *cli, args []string) error {
		cl, err := cli.openNoArgs(ctx, fs, out, args)
		if err != nil {
			return err
		}
		defer cl.Close()
		recs, err := cl.PodCheckpoints(ctx)
		if err != nil {
			return err
		}
		switch {
		case out.quiet:
			for _, r := range recs {
				out.ids(cli.stdout, r.ID)
			}
			return nil
		case out.json():
			views := make([]podView, 0, len(recs))
			for _, r := range recs {
				views = append(views, podJSON(r))
			}
			return printJSON(cli.stdout, views)
		}
		return writePodTable(cli.stdout, recs, time.Now())
	}
}

func podRestoreFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	return podRestoreCommand(fs, (*ckclient.Client).PodRestore)
}

func podForkFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	return podRestoreCommand(fs, (*ckclient.Client).PodFork)
}

// podRestoreCommand is pod restore and pod fork, which differ in what brings the pod back.
func podRestoreCommand(fs *flag.FlagSet, restore func(*ckclient.Client, context.Context, string, io.Writer) (ckclient.PodRestored, error)) func(context.Context, *cli, []string) error {
	out := outputFlags(fs, "the pod sandbox's id")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) != 1 {
			return usageError("want one POD-CHECKPOINT (id or unique id prefix)")
		}
		cl, err := cli.open(ctx, out)
		if err != nil {
			return err
		}
		defer cl.Close()
		res, err := restore(cl, ctx, args[0], progressTo(cli.stderr))
		if err != nil {
			return err
		}
		switch {
		case out.quiet:
			out.ids(cli.stdout, res.Sandbox)
			return nil
		case out.json():
			return printJSON(cli.stdout, res)
		}
		fmt.Fprintf(cli.stdout, "pod %s (sandbox %s) at pod checkpoint %s: %d containers (%d ms)\n", res.Pod, shortID(res.Sandbox), res.Checkpoint, len(res.Containers), res.TookMs)
		return nil
	}
}

func podRemoveFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	out := outputFlags(fs, "the ids removed")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) == 0 {
			return usageError("want POD-CHECKPOINT... (ids or unique id prefixes)")
		}
		cl, err := cli.open(ctx, out)
		if err != nil {
			return err
		}
		defer cl.Close()
		var removed []podView
		for _, ref := range args {
			rec, err := cl.PodRemove(ctx, ref)
			if err != nil {
				return err
			}
			removed = append(removed, podJSON(rec))
		}
		switch {
		case out.json():
			return printJSON(cli.stdout, removed)
		case out.quiet:
			for _, r := range removed {
				out.ids(cli.stdout, r.ID)
			}
			return nil
		}
		for _, r := range removed {
			fmt.Fprintf(cli.stdout, "removed pod checkpoint %s of %s and its %d checkpoints\n", r.ID, r.Pod, len(r.Members))
		}
		return nil
	}
}

// podView is a pod checkpoint as the commands print it in JSON.
type podView struct {
	podckpt.Record
	Dir string `json:"dir"`
}

func podJSON(r podckpt.Record) podView { return podView{Record: r, Dir: r.Dir} }

// writePodTable draws the pod checkpoints, one a line: id, pod, age, the containers and their
// checkpoints, and the volumes' size.
func writePodTable(w io.Writer, recs []podckpt.Record, now time.Time) error {
	if len(recs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD CHECKPOINT\tPOD\tAGE\tFROZEN\tVOLUMES\tCONTAINERS")
	for _, r := range recs {
		members := make([]string, 0, len(r.Members))
		for _, m := range r.Members {
			members = append(members, m.Name+"="+m.Checkpoint)
		}
		slices.Sort(members)
		var bytes int64
		for _, v := range r.Volumes {
			bytes += v.Bytes
		}
		vols := "-"
		if len(r.Volumes) > 0 {
			vols = fmt.Sprintf("%d (%s)", len(r.Volumes), units.HumanSizeWithPrecision(float64(bytes), 3))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d ms\t%s\t%s\n", r.ID, r.Pod, age(now.Sub(r.Created)), r.FrozenMs, vols, strings.Join(members, " "))
	}
	return tw.Flush()
}
