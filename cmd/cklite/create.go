package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"

	"github.com/cklite/cklite/pkg/checkpoint"
)

func checkpointCreateFlags(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
	fsOnly := fs.Bool("fs-only", false, "freeze the filesystem only: no CRIU, the task runs on untouched")
	memoryOnly := fs.Bool("memory-only", false, "dump the processes only: a rollback keeps the container's current files")
	exit := fs.Bool("exit", false, "stop the task after the checkpoint (default: it keeps running)")
	imagePath := fs.String("image-path", "", "write the CRIU image directory to `DIR` (default: NAMESPACE/CONTAINER-TIME in containerd's checkpoints directory, see cklite paths)")
	ttl := fs.Duration("ttl", 0, "remove the checkpoint after `DURATION` (default: the container's cklite.io/checkpoint-ttl, else the shim's default)")
	tcp := fs.Bool("tcp", false, "checkpoint established TCP connections (CRIU's tcp-established)")
	fileLocks := fs.Bool("file-locks", false, "checkpoint file locks")
	return func(ctx context.Context, cli *cli, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("want one CONTAINER: %w", errdefs.ErrInvalidArgument)
		}
		if *fsOnly && *memoryOnly {
			return fmt.Errorf("--fs-only and --memory-only exclude each other: %w", errdefs.ErrInvalidArgument)
		}
		if *ttl < 0 {
			return fmt.Errorf("--ttl %v: want a positive duration: %w", *ttl, errdefs.ErrInvalidArgument)
		}
		ctrd, ctx, err := cli.connect(ctx)
		if err != nil {
			return err
		}
		defer ctrd.Close()
		c, err := ckliteContainer(ctx, ctrd, args[0])
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
		restore, err := setLabelsFor(ctx, c, request)
		if err != nil {
			return err
		}
		defer restore()

		fmt.Fprintf(cli.stdout, "checkpointing %s into %s\n", c.ID(), dir)
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
		fmt.Fprintf(cli.stdout, "checkpoint %s (%s) of %s in %s\n", m.ID, m.Contents, c.ID(), took.Round(time.Millisecond))
		return nil
	}
}

// ckliteContainer loads container id and refuses it, before anything is asked of its task, unless
// it runs on cklite's runtime.
func ckliteContainer(ctx context.Context, ctrd *client.Client, id string) (client.Container, error) {
	c, err := lookupContainer(ctx, ctrd, id)
	if err != nil {
		return nil, err
	}
	info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", id, err)
	}
	if err := checkpoint.CheckRuntime(id, info.Runtime.Name); err != nil {
		// Under the runc name by path (docs/architecture.md) the record does not say which shim
		// runs the task: the task's init, whose parent is its shim, does.
		if shim := shimBinary(ctx, c); shim != "" && checkpoint.CheckRuntime(id, shim) == nil {
			return c, nil
		}
		return nil, err
	}
	return c, nil
}

// lookupContainer finds a container as nerdctl does: by id, else by its nerdctl name (a fork's
// name included), else by a unique id prefix.
func lookupContainer(ctx context.Context, ctrd *client.Client, ref string) (client.Container, error) {
	c, err := ctrd.LoadContainer(ctx, ref)
	if err == nil || !errdefs.IsNotFound(err) {
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", ref, err)
		}
		return c, nil
	}
	for _, filter := range []string{fmt.Sprintf("labels.%q==%q", "nerdctl/name", ref), fmt.Sprintf("id~=^%s", regexp.QuoteMeta(ref))} {
		cs, err := ctrd.Containers(ctx, filter)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", ref, err)
		}
		switch len(cs) {
		case 0:
			continue
		case 1:
			return cs[0], nil
		}
		return nil, fmt.Errorf("container %s: %d containers match; give more of the id: %w", ref, len(cs), errdefs.ErrInvalidArgument)
	}
	return nil, fmt.Errorf("container %s: no container has this id, name or id prefix: %w", ref, errdefs.ErrNotFound)
}

// shimBinary is the path of the binary of the shim running c's task, or "" when that cannot be
// told: no task, or its init not in this PID namespace. A shim is the parent of its task's init
// (a child subreaper, also of a restored one).
func shimBinary(ctx context.Context, c client.Container) string {
	task, err := c.Task(ctx, nil)
	if err != nil || task.Pid() == 0 {
		return ""
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", task.Pid()))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(status), "\n") {
		if ppid, ok := strings.CutPrefix(line, "PPid:"); ok {
			exe, err := os.Readlink(fmt.Sprintf("/proc/%s/exe", strings.TrimSpace(ppid)))
			if err != nil {
				return ""
			}
			return strings.TrimSuffix(exe, " (deleted)")
		}
	}
	return ""
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
