package client

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/fork"
)

// RollbackOptions shape Rollback.
type RollbackOptions struct {
	// ImagePath is the CRIU image directory to roll back from (default: the one the checkpoint
	// was taken into); with it the checkpoint ref may be "".
	ImagePath string
	// ForceForeign allows a checkpoint outside the container's lineage: another container's
	// memory and files replace this one's.
	ForceForeign bool
	Progress     io.Writer // where to say what is being done (nil: nowhere)
}

// RolledBack is a rollback done.
type RolledBack struct {
	Container     string // id
	ContainerName string // nerdctl's name, or ""
	Checkpoint    checkpoint.Meta
	Took          time.Duration
}

// Rollback rolls the running (or paused) container ref names back to checkpoint ckRef in place:
// the same task, stdio and network namespace. The task API has no such call: the shim takes it as
// the annotation checkpoint.RollbackKey of a task Update, which containerd passes on unchanged.
// The shim, not the client, checks the checkpoint against the container's lineage
// (errdefs.ErrPermissionDenied), so that it refuses whichever client asks.
func (c *Client) Rollback(ctx context.Context, ref, ckRef string, opts RollbackOptions) (RolledBack, error) {
	ctx = c.Context(ctx)
	if ckRef == "" && opts.ImagePath == "" {
		return RolledBack{}, fmt.Errorf("no checkpoint and no image directory to roll back to: %w", errdefs.ErrInvalidArgument)
	}
	ctr, err := c.CkliteContainer(ctx, ref)
	if err != nil {
		return RolledBack{}, err
	}
	src, err := c.Source(ctx, ckRef, opts.ImagePath)
	if err != nil {
		return RolledBack{}, err
	}
	annotations := map[string]string{checkpoint.RollbackKey: src.ImageDir}
	if opts.ForceForeign {
		annotations[checkpoint.ForceForeignKey] = "true"
	}
	progress(opts.Progress, "rolling %s back to checkpoint %s\n", ctr.ID(), src.Checkpoint.ID)
	start := time.Now()
	if _, err := c.ctrd.TaskService().Update(ctx, &tasks.UpdateTaskRequest{ContainerID: ctr.ID(), Annotations: annotations}); err != nil {
		return RolledBack{}, fmt.Errorf("roll back %s: %w", ctr.ID(), errgrpc.ToNative(err))
	}
	return RolledBack{Container: ctr.ID(), ContainerName: ContainerName(ctx, ctr), Checkpoint: src.Checkpoint, Took: time.Since(start)}, nil
}

// Source is the checkpoint ref names with its images in imagePath or where it recorded them (or,
// for one nerdctl took, in nerdctl's checkpoint directory); or, with ref "", the checkpoint whose
// images are in imagePath, which must still be listed: its lease is what keeps its frozen layer.
// A ref that names no checkpoint may name a nerdctl checkpoint (nerdctl checkpoint create's
// NAME). It is what Fork and Rollback restore.
func (c *Client) Source(ctx context.Context, ref, imagePath string) (fork.Source, error) {
	ctx = c.Context(ctx)
	if ref == "" {
		src, err := fork.FromImageDir(imagePath)
		if err != nil {
			return fork.Source{}, err
		}
		if _, err := c.Lookup(ctx, src.Checkpoint.ID); err != nil {
			return fork.Source{}, fmt.Errorf("the checkpoint of %s: %w", imagePath, err)
		}
		return src, nil
	}
	r, err := c.Lookup(ctx, ref)
	if errdefs.IsNotFound(err) && imagePath == "" {
		// A nerdctl checkpoint's name.
		if dir := nerdctlImages("", ref); dir != "" {
			return c.Source(ctx, "", dir)
		}
	}
	if err != nil {
		return fork.Source{}, err
	}
	if imagePath == "" && r.ImagePath == "" {
		imagePath = nerdctlImages(r.ID, "")
	}
	return fork.SourceOf(r, imagePath)
}

// Fork restores src (Source) into opts.Count new containers, all running at once, next to the
// checkpointed container (pkg/fork).
func (c *Client) Fork(ctx context.Context, src fork.Source, opts fork.Options) (fork.Report, error) {
	return fork.Run(c.Context(ctx), c.ctrd, src, opts)
}
