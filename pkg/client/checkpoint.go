package client

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/config"
	"github.com/cklite/cklite/pkg/paths"
)

// CheckpointOptions shape Checkpoint; the zero value takes memory and filesystem, leaving the
// task running, into a new directory of the containerd's own (Paths).
type CheckpointOptions struct {
	Contents  checkpoint.Contents // "" is checkpoint.MemoryAndFS
	Exit      bool                // stop the task after the checkpoint
	ImagePath string              // the CRIU image directory to write; must not exist or be empty
	TTL       time.Duration       // remove the checkpoint after it (0: the container's or the shim's default)
	TCP       bool                // checkpoint established TCP connections
	FileLocks bool                // checkpoint file locks
	Name      string              // unique among the container's checkpoints
	Labels    map[string]string
	Progress  io.Writer // where to say what is being done (nil: nowhere)
}

// Created is a checkpoint Checkpoint took, and how long the shim took.
type Created struct {
	Checkpoint
	Took time.Duration
}

// Checkpoint checkpoints the container ref names (id, nerdctl name or unique id prefix), which
// must run on cklite's runtime. It goes to containerd's task service directly: the Go client's
// Task.Checkpoint would pause the task around it and build a checkpoint image and a rootfs diff,
// none of which a cklite checkpoint needs. A checkpoint that fails leaves no image directory of
// its own behind.
func (c *Client) Checkpoint(ctx context.Context, ref string, opts CheckpointOptions) (Created, error) {
	ctx = c.Context(ctx)
	if opts.Name != "" {
		if err := checkpoint.ValidateName(opts.Name); err != nil {
			return Created{}, err
		}
	}
	if opts.TTL < 0 {
		return Created{}, fmt.Errorf("ttl %v: want a positive duration: %w", opts.TTL, errdefs.ErrInvalidArgument)
	}
	if _, err := checkpoint.ParseContents(string(opts.Contents)); err != nil {
		return Created{}, err
	}
	ctr, err := c.CkliteContainer(ctx, ref)
	if err != nil {
		return Created{}, err
	}
	if opts.Name != "" {
		if err := c.nameFree(ctx, ctr.ID(), opts.Name); err != nil {
			return Created{}, err
		}
	}
	dir, err := c.imageDir(ctx, ctr.ID(), opts.ImagePath)
	if err != nil {
		return Created{}, err
	}
	restore, err := setLabelsFor(ctx, ctr, opts.request())
	if err != nil {
		return Created{}, err
	}
	defer restore()
	progress(opts.Progress, "checkpointing %s into %s\n", ctr.ID(), dir)
	start := time.Now()
	m, err := c.checkpointInto(ctx, ctr.ID(), dir, opts)
	if err != nil {
		return Created{}, err
	}
	took := time.Since(start)
	v, err := c.Describe(ctx, checkpoint.Record{Meta: m, ImagePath: dir}, true)
	if err != nil {
		log.G(ctx).WithError(err).WithField("checkpoint", m.ID).Debug("usage of the frozen layer")
	}
	return Created{Checkpoint: v, Took: took}, nil
}

// checkpointInto asks the shim for the checkpoint of container id into dir and reads what it
// recorded. On failure dir goes again, unless it was there before (a refused non-empty one).
func (c *Client) checkpointInto(ctx context.Context, id, dir string, opts CheckpointOptions) (checkpoint.Meta, error) {
	_, statErr := os.Stat(dir)
	existed := statErr == nil
	m, err := c.taskCheckpoint(ctx, id, dir, opts)
	if err != nil && !existed {
		if rerr := os.RemoveAll(dir); rerr != nil {
			log.G(ctx).WithError(rerr).WithField("dir", dir).Warn("remove the image directory of a failed checkpoint")
		}
	}
	return m, err
}

func (c *Client) taskCheckpoint(ctx context.Context, id, dir string, opts CheckpointOptions) (checkpoint.Meta, error) {
	o, err := typeurl.MarshalAnyToProto(&options.CheckpointOptions{Exit: opts.Exit, OpenTcp: opts.TCP, FileLocks: opts.FileLocks, ImagePath: dir})
	if err != nil {
		return checkpoint.Meta{}, err
	}
	if _, err := c.ctrd.TaskService().Checkpoint(ctx, &tasks.CheckpointTaskRequest{ContainerID: id, Options: o}); err != nil {
		return checkpoint.Meta{}, fmt.Errorf("checkpoint %s: %w", id, errgrpc.ToNative(err))
	}
	m, err := checkpoint.Read(dir)
	if err != nil {
		return checkpoint.Meta{}, fmt.Errorf("checkpoint of %s taken, but: %w (is its runtime %s?)", id, err, checkpoint.Runtime)
	}
	return m, nil
}

// imageDir is the absolute image directory of a checkpoint of container id: dir, or a new one
// in the containerd's checkpoints directory. Its parent is made.
func (c *Client) imageDir(ctx context.Context, id, dir string) (string, error) {
	if dir == "" {
		inst, err := c.Paths(ctx)
		if err != nil {
			return "", err
		}
		root, err := inst.NamespaceCheckpoints(c.namespace)
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, fmt.Sprintf("%s-%s", id, time.Now().UTC().Format("20060102T150405.000")))
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", fmt.Errorf("image directory: %w", err)
	}
	return dir, nil
}

// Paths is where cklite keeps the state of the client's containerd: the state directory of the
// shim's configuration (read as the shim reads it), in the directory of that containerd instance
// (pkg/paths), so that the client agrees with the shims of the same containerd.
func (c *Client) Paths(ctx context.Context) (paths.Instance, error) {
	cfg, err := config.LoadShim()
	if err != nil {
		return paths.Instance{}, err
	}
	return paths.ForContainerd(c.Context(ctx), cfg.StateDir, c.ctrd.IntrospectionService())
}

// request is the container labels that ask the shim for what the task API's checkpoint options
// cannot say.
func (o CheckpointOptions) request() map[string]string {
	r := map[string]string{}
	if o.Contents != "" && o.Contents != checkpoint.MemoryAndFS {
		r[checkpoint.ContentsKey] = string(o.Contents)
	}
	if o.TTL > 0 {
		r[checkpoint.TTLKey] = o.TTL.String()
	}
	if o.Name != "" {
		r[checkpoint.NameKey] = o.Name
	}
	if len(o.Labels) > 0 {
		r[checkpoint.LabelsKey] = checkpoint.EncodeLabels(o.Labels)
	}
	return r
}

// nameFree refuses name when another checkpoint of container id has it.
func (c *Client) nameFree(ctx context.Context, id, name string) error {
	records, err := checkpoint.Named(c.Context(ctx), c.ctrd.LeasesService(), c.namespace, id, name)
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
func setLabelsFor(ctx context.Context, c containerd.Container, labels map[string]string) (func(), error) {
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

// progress writes to w, if any.
func progress(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format, args...)
	}
}
