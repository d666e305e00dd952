package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"

	"github.com/cklite/cklite/pkg/checkpoint"
	ckclient "github.com/cklite/cklite/pkg/client"
)

func checkpointCreateFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	fsOnly := fs.Bool("fs-only", false, "freeze the filesystem only: no CRIU, the task runs on untouched")
	memoryOnly := fs.Bool("memory-only", false, "dump the processes only: a rollback keeps the container's current files")
	exit := fs.Bool("exit", false, "stop the task after the checkpoint (default: it keeps running)")
	imagePath := fs.String("image-path", "", "write the CRIU image directory to `DIR` (default: NAMESPACE/CONTAINER-TIME in containerd's checkpoints directory, see cklite paths)")
	ttl := fs.Duration("ttl", 0, "remove the checkpoint after `DURATION` (default: the container's cklite.io/checkpoint-ttl, else the shim's default)")
	tcp := fs.Bool("tcp", false, "checkpoint established TCP connections (CRIU's tcp-established)")
	fileLocks := fs.Bool("file-locks", false, "checkpoint file locks")
	name := fs.String("name", "", "name the checkpoint `NAME`, unique among the container's checkpoints; usable wherever its id is")
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
		if *ttl < 0 {
			return usageError("--ttl %v: want a positive duration", *ttl)
		}
		if *name != "" {
			if err := checkpoint.ValidateName(*name); err != nil {
				return usageErr{err}
			}
		}
		if err := out.check(); err != nil {
			return err
		}
		ctrd, ctx, err := cli.containerd(ctx)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		c, err := ckclient.FromContainerd(ctrd, cli.namespace).CkliteContainer(ctx, args[0])
		if err != nil {
			return err
		}
		dir := *imagePath
		if dir == "" {
			inst, err := defaultPaths(ctx, ctrd)
			if err != nil {
				return err
			}
			root, err := inst.NamespaceCheckpoints(cli.namespace)
			if err != nil {
				return err
			}
			dir = filepath.Join(root, fmt.Sprintf("%s-%s", c.ID(), time.Now().UTC().Format("20060102T150405.000")))
		}
		if dir, err = filepath.Abs(dir); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return fmt.Errorf("image directory: %w", err)
		}
		request := map[string]string{}
		switch {
		case *fsOnly:
			request[checkpoint.ContentsKey] = string(checkpoint.FSOnly)
		case *memoryOnly:
			request[checkpoint.ContentsKey] = string(checkpoint.MemoryOnly)
		}
		if *ttl > 0 {
			request[checkpoint.TTLKey] = ttl.String()
		}
		if *name != "" {
			if err := nameFree(ctx, ctrd, cli.namespace, c.ID(), *name); err != nil {
				return err
			}
			request[checkpoint.NameKey] = *name
		}
		if len(labels.m) > 0 {
			request[checkpoint.LabelsKey] = checkpoint.EncodeLabels(labels.m)
		}
		restore, err := setLabelsFor(ctx, c, request)
		if err != nil {
			return err
		}
		defer restore()

		fmt.Fprintf(progressTo(cli.stderr), "checkpointing %s into %s\n", c.ID(), dir)
		start := time.Now()
		opts, err := typeurl.MarshalAnyToProto(&options.CheckpointOptions{Exit: *exit, OpenTcp: *tcp, FileLocks: *fileLocks, ImagePath: dir})
		if err != nil {
			return err
		}
		// Straight to the task service: the client's Task.Checkpoint would pause the task around
		// it and build a checkpoint image and a rootfs diff, none of which a cklite checkpoint needs.
		if _, err := ctrd.TaskService().Checkpoint(ctx, &tasks.CheckpointTaskRequest{ContainerID: c.ID(), Options: opts}); err != nil {
			return fmt.Errorf("checkpoint %s: %w", c.ID(), errgrpc.ToNative(err))
		}
		took := time.Since(start)
		m, err := checkpoint.Read(dir)
		if err != nil {
			return fmt.Errorf("checkpoint of %s taken, but: %w (is its runtime io.containerd.cklite.v2?)", c.ID(), err)
		}
		switch {
		case out.quiet:
			out.ids(cli.stdout, m.ID)
		case out.json():
			v := newViewer(ctx, ckclient.FromContainerd(ctrd, cli.namespace), cli).view(checkpoint.Record{Meta: m, ImagePath: dir})
			return printJSON(cli.stdout, createdView{Checkpoint: v, TookMs: took.Milliseconds()})
		default:
			fmt.Fprintf(cli.stdout, "checkpoint %s (%s) of %s in %s\n", m.ID, m.Contents, c.ID(), took.Round(time.Millisecond))
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

// nameFree refuses name when another checkpoint of container id has it.
func nameFree(ctx context.Context, ctrd *client.Client, namespace, id, name string) error {
	records, err := checkpoint.List(ctx, ctrd.LeasesService(), namespace)
	if err != nil {
		return err
	}
	for _, r := range records {
		if r.Container == id && r.Name == name {
			return fmt.Errorf("container %s has a checkpoint named %s already (%s): %w", id, name, r.ID, errdefs.ErrAlreadyExists)
		}
	}
	return nil
}

// setLabelsFor sets labels on c for the one checkpoint the shim reads them for, and returns what
// puts the previous values back. The task API's checkpoint options (containerd's runc type, the
// only one the daemon passes on) have no field for what cklite asks: labels do.
func setLabelsFor(ctx context.Context, c client.Container, labels map[string]string) (func(), error) {
	if len(labels) == 0 {
		return func() {}, nil
	}
	old, err := c.Labels(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := c.SetLabels(ctx, labels); err != nil {
		return nil, fmt.Errorf("label %s for the checkpoint: %w", c.ID(), err)
	}
	return func() {
		back := map[string]string{}
		for k := range labels {
			back[k] = old[k] // "" removes a label that was not there
		}
		_, _ = c.SetLabels(context.WithoutCancel(ctx), back)
	}, nil
}
