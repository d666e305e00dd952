package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/cklite/cklite/pkg/checkpoint"
	ckclient "github.com/cklite/cklite/pkg/client"
)

func checkpointCreateFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	fsOnly := fs.Bool("fs-only", false, "freeze the filesystem only: no CRIU, the task runs on untouched")
	memoryOnly := fs.Bool("memory-only", false, "dump the processes only: a rollback keeps the container's current files")
	var opts ckclient.CheckpointOptions
	fs.BoolVar(&opts.Exit, "exit", false, "stop the task after the checkpoint (default: it keeps running)")
	fs.StringVar(&opts.ImagePath, "image-path", "", "write the CRIU image directory to `DIR` (default: NAMESPACE/CONTAINER-TIME in containerd's checkpoints directory, see cklite paths)")
	fs.DurationVar(&opts.TTL, "ttl", 0, "remove the checkpoint after `DURATION` (default: the container's cklite.io/checkpoint-ttl, else the shim's default)")
	fs.BoolVar(&opts.TCP, "tcp", false, "checkpoint established TCP connections (CRIU's tcp-established)")
	fs.BoolVar(&opts.FileLocks, "file-locks", false, "checkpoint file locks")
	fs.StringVar(&opts.Name, "name", "", "name the checkpoint `NAME`, unique among the container's checkpoints; usable wherever its id is")
	var labels labelList
	fs.Var(&labels, "label", "label the checkpoint `KEY=VALUE` (repeatable; checkpoint ls --label selects by them)")
	out := outputFlags(fs, "the checkpoint's id")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) != 1 {
			return usageError("want one CONTAINER")
		}
		if *fsOnly && *memoryOnly {
			return usageError("--fs-only and --memory-only exclude each other")
		}
		if opts.TTL < 0 {
			return usageError("--ttl %v: want a positive duration", opts.TTL)
		}
		if opts.Name != "" {
			if err := checkpoint.ValidateName(opts.Name); err != nil {
				return usageErr{err}
			}
		}
		if err := out.check(); err != nil {
			return err
		}
		switch {
		case *fsOnly:
			opts.Contents = checkpoint.FSOnly
		case *memoryOnly:
			opts.Contents = checkpoint.MemoryOnly
		}
		opts.Labels = labels.m
		opts.Progress = progressTo(cli.stderr)
		cl, err := cli.connect(ctx)
		if err != nil {
			return err
		}
		defer cl.Close()
		ck, err := cl.Checkpoint(ctx, args[0], opts)
		if err != nil {
			return err
		}
		switch {
		case out.quiet:
			out.ids(cli.stdout, ck.ID)
		case out.json():
			return printJSON(cli.stdout, createdView{Checkpoint: ck.Checkpoint, TookMs: ck.Took.Milliseconds()})
		default:
			fmt.Fprintf(cli.stdout, "checkpoint %s (%s) of %s in %s\n", ck.ID, ck.Contents, ck.Container, ck.Took.Round(time.Millisecond))
		}
		return nil
	}
}

// createdView is what checkpoint create --format json prints: the checkpoint, as inspect prints
// it, and how long it took.
type createdView struct {
	ckclient.Checkpoint
	TookMs int64 `json:"tookMs"`
}
