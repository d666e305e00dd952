package harness

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/integration/harness/hostcheck"
	"github.com/cklite/cklite/pkg/localimage"
)

// StartTask creates c's task with its stdio discarded and starts it; opts may name a checkpoint
// to restore. A task that fails to start is deleted again.
func (d *Daemon) StartTask(ctx context.Context, c client.Container, opts ...client.NewTaskOpts) (client.Task, error) {
	task, err := c.NewTask(ctx, cio.NullIO, opts...)
	if err != nil {
		return nil, err
	}
	if err := task.Start(ctx); err != nil {
		_, _ = task.Delete(ctx, client.WithProcessKill)
		return nil, err
	}
	return task, nil
}

// DeleteTask kills and deletes c's task, if it has one.
func (d *Daemon) DeleteTask(ctx context.Context, c client.Container) error {
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err == nil {
		_, err = task.Delete(ctx, client.WithProcessKill)
	}
	if err != nil {
		return fmt.Errorf("deleting the task of %s: %w", c.ID(), err)
	}
	return nil
}

// Remove kills and deletes container id's task, if it has one, then the container and its
// snapshot, if they exist.
func (d *Daemon) Remove(ctx context.Context, id string) error {
	c, err := d.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := d.DeleteTask(ctx, c); err != nil {
		return err
	}
	return c.Delete(ctx, client.WithSnapshotCleanup)
}

// Run creates container id from img on runtime and snapshotter, running args, and starts its task.
func (d *Daemon) Run(ctx context.Context, id string, img client.Image, runtime, snapshotter string, args ...string) (client.Container, client.Task, error) {
	c, err := d.client.NewContainer(ctx, id,
		client.WithSnapshotter(snapshotter),
		client.WithNewSnapshot(id, img),
		client.WithRuntime(runtime, nil),
		client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs(args...)))
	if err != nil {
		return nil, nil, err
	}
	task, err := d.StartTask(ctx, c)
	return c, task, err
}

// StartWithCklite starts a daemon with both runtimes, the stock runc shim on overlayfs and cklite
// on cklite-snapshotter, after checking cklite's binaries are built and CRIU works here: what the
// demo and the benchmark compare on.
func StartWithCklite(ctx context.Context) (*Daemon, hostcheck.CRIUVersion, error) {
	stack, err := LoadStack()
	if err != nil {
		return nil, hostcheck.CRIUVersion{}, err
	}
	for _, bin := range []string{"containerd-shim-cklite-v2", "cklite-snapshotter", "cklite"} {
		if !stack.Has(bin) {
			return nil, hostcheck.CRIUVersion{}, fmt.Errorf("%s is not built in %s: run 'make build'", bin, stack.ProjectBin)
		}
	}
	criu, err := stack.CheckCRIU(ctx)
	if err != nil {
		return nil, criu, err
	}
	d, err := Start(ctx, stack, Config{CkliteSnapshotter: true})
	return d, criu, err
}

// ImportUnpacked imports a locally built image and unpacks it into each of snapshotters, so that
// containers on any of them start without unpacking first.
func (d *Daemon) ImportUnpacked(ctx context.Context, img localimage.Image, snapshotters ...string) (client.Image, error) {
	if err := d.Import(ctx, img); err != nil {
		return nil, err
	}
	ci, err := d.client.GetImage(ctx, img.Name)
	if err != nil {
		return nil, err
	}
	for _, sn := range snapshotters {
		if err := ci.Unpack(ctx, sn); err != nil {
			return nil, fmt.Errorf("unpacking %s into %s: %w", img.Name, sn, err)
		}
	}
	return ci, nil
}
