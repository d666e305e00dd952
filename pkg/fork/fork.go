// Package fork restores one checkpoint into many new containers, all running at once: the
// sandboxes of a tree search or of RL rollouts, forked from one state.
//
// Each fork is a container of its own, made from the record of the container the checkpoint was
// taken of (image, runtime and its options, snapshotter, labels, spec), with its own id, cgroup,
// network namespace and rootfs snapshot, and a task restored from the checkpoint's CRIU image
// directory (client.WithRestoreImagePath). The rootfs snapshot is prepared on the image; the
// cklite shim re-points it onto the checkpoint's frozen layer when it reads the directory's
// metadata, so a fork starts with the checkpoint's files and what it writes is its own.
package fork

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// Options say how many forks to make and how.
type Options struct {
	Count int
	// Prefix names the forks Prefix-1 ... Prefix-Count; "" means DefaultPrefix of the
	// container the checkpoint was taken of.
	Prefix string
	// LogDir, when set, receives each fork's stdout and stderr in <id>.log; otherwise they are
	// discarded. It must be absolute: the shim opens it.
	LogDir string
	// CleanupOnError removes the forks already started when one fails; otherwise they stay.
	CleanupOnError bool
	// Parallel is how many forks start at once (at least one). A fork's restore spends much of
	// its time waiting on containerd, the shim and CRIU's children, so several overlap well.
	Parallel int
	// Progress, when set, is called after each fork starts, one call at a time.
	Progress func(Fork)
}

// Fork is one started fork.
type Fork struct {
	ID   string
	Took time.Duration // from creating the container to its restored task running
}

// Report is what Run did, also when it failed.
type Report struct {
	Forks   []Fork   // the forks running (after a failure: those that stay)
	Removed []string // after a failure with CleanupOnError: the forks started and removed again
	Took    time.Duration
}

// Run makes opts.Count forks of src in the namespace of ctx, opts.Parallel at a time, and returns
// when all run. If one fails, no further fork starts: the failed fork is removed, the ones started
// (and those still starting, once they have) stay unless opts.CleanupOnError, and the error names
// the fork and why.
func Run(ctx context.Context, c *client.Client, src Source, opts Options) (Report, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return Report{}, err
	}
	if src.Checkpoint.Namespace != "" && src.Checkpoint.Namespace != ns {
		return Report{}, fmt.Errorf("checkpoint %s was taken in namespace %s, not %s: its container and frozen layer are there: %w",
			src.Checkpoint.ID, src.Checkpoint.Namespace, ns, errdefs.ErrInvalidArgument)
	}
	if opts.LogDir != "" && !filepath.IsAbs(opts.LogDir) {
		return Report{}, fmt.Errorf("log directory %s is not absolute: %w", opts.LogDir, errdefs.ErrInvalidArgument)
	}
	t, err := newTemplate(ctx, c, src, opts.LogDir)
	if err != nil {
		return Report{}, err
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix(t.original)
	}
	names, err := Names(prefix, opts.Count)
	if err != nil {
		return Report{}, err
	}
	return run(ctx, t, names, opts)
}

// forker is what run needs of a template; tests fake it.
type forker interface {
	exists(ctx context.Context, id string) (bool, error)
	// start makes fork id and starts its task, or leaves nothing of it.
	start(ctx context.Context, id string) error
	remove(ctx context.Context, id string) error
}

func run(ctx context.Context, f forker, names []string, opts Options) (Report, error) {
	// A name taken halfway through would fail the run after forks have started: check all first.
	for _, id := range names {
		taken, err := f.exists(ctx, id)
		if err != nil {
			return Report{}, err
		}
		if taken {
			return Report{}, fmt.Errorf("container %s already exists: choose another prefix: %w", id, errdefs.ErrAlreadyExists)
		}
	}
	began := time.Now()
	var (
		mu      sync.Mutex
		failed  []error
		running = make([]*Fork, len(names)) // by position in names, whatever order they start in
		slots   = make(chan struct{}, max(opts.Parallel, 1))
		wg      sync.WaitGroup
	)
	stopped := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(failed) > 0
	}
	for i, id := range names {
		slots <- struct{}{}
		if stopped() {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			start := time.Now()
			err := f.start(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, fmt.Errorf("fork %d of %d (%s): %w", i+1, len(names), id, err))
				return
			}
			fk := Fork{ID: id, Took: time.Since(start)}
			log.G(ctx).WithField("fork", id).WithField("took", fk.Took).Debug("fork running")
			running[i] = &fk
			if opts.Progress != nil {
				opts.Progress(fk)
			}
		}()
	}
	wg.Wait()
	var rep Report
	for _, fk := range running {
		if fk != nil {
			rep.Forks = append(rep.Forks, *fk)
		}
	}
	if len(failed) > 0 {
		err := errors.Join(failed...)
		if opts.CleanupOnError {
			err = errors.Join(err, removeAll(context.WithoutCancel(ctx), f, &rep))
		}
		rep.Took = time.Since(began)
		return rep, err
	}
	rep.Took = time.Since(began)
	return rep, nil
}

// removeAll removes the forks of rep, moving them from Forks to Removed; a fork that cannot be
// removed stays in Forks.
func removeAll(ctx context.Context, f forker, rep *Report) error {
	var errs []error
	var stay []Fork
	for _, fk := range rep.Forks {
		if err := f.remove(ctx, fk.ID); err != nil {
			errs = append(errs, fmt.Errorf("remove fork %s: %w", fk.ID, err))
			stay = append(stay, fk)
			continue
		}
		rep.Removed = append(rep.Removed, fk.ID)
	}
	rep.Forks = stay
	return errors.Join(errs...)
}

// template makes forks of one checkpoint from what they share, read once.
type template struct {
	client   *client.Client
	imageDir string
	original containers.Container
	image    client.Image
	logDir   string
}

func newTemplate(ctx context.Context, c *client.Client, src Source, logDir string) (*template, error) {
	name := src.Checkpoint.Container
	original, err := c.ContainerService().Get(ctx, name)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("container %s, of which checkpoint %s was taken, no longer exists (a fork copies its image, runtime and spec): %w",
			name, src.Checkpoint.ID, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("container %s of checkpoint %s: %w", name, src.Checkpoint.ID, err)
	}
	if err := checkpoint.CheckRuntime(name, original.Runtime.Name); err != nil {
		return nil, err
	}
	if original.Image == "" {
		return nil, fmt.Errorf("container %s was created without an image; a fork prepares its rootfs snapshot on one: %w", name, errdefs.ErrFailedPrecondition)
	}
	if original.Spec == nil {
		return nil, fmt.Errorf("container %s has no runtime spec: %w", name, errdefs.ErrFailedPrecondition)
	}
	image, err := c.GetImage(ctx, original.Image)
	if err != nil {
		return nil, fmt.Errorf("image %s of container %s: %w", original.Image, name, err)
	}
	return &template{client: c, imageDir: src.ImageDir, original: original, image: image, logDir: logDir}, nil
}

func (t *template) exists(ctx context.Context, id string) (bool, error) {
	_, err := t.client.ContainerService().Get(ctx, id)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

func (t *template) start(ctx context.Context, id string) (retErr error) {
	spec, err := specFor(t.original.Spec.GetValue(), id)
	if err != nil {
		return err
	}
	ctr, err := t.client.NewContainer(ctx, id,
		client.WithSnapshotter(t.original.Snapshotter),
		client.WithNewSnapshot(id, t.image),
		client.WithContainerLabels(labelsFor(t.original.Labels)),
		client.WithSpec(spec),
		withRuntime(t.original.Runtime),
	)
	if err != nil {
		return fmt.Errorf("create container: %w", err)
	}
	defer func() {
		if retErr != nil {
			if err := t.remove(context.WithoutCancel(ctx), id); err != nil {
				retErr = errors.Join(retErr, fmt.Errorf("remove the failed fork: %w", err))
			}
		}
	}()
	stdio := cio.NullIO
	if t.logDir != "" {
		stdio = cio.LogFile(filepath.Join(t.logDir, id+".log"))
	}
	task, err := ctr.NewTask(ctx, stdio, client.WithRestoreImagePath(t.imageDir))
	if err != nil {
		return fmt.Errorf("restore task from %s: %w", t.imageDir, err)
	}
	if err := task.Start(ctx); err != nil {
		return fmt.Errorf("start restored task: %w", err)
	}
	return nil
}

// withRuntime gives a fork the original's runtime and runtime options as they are stored, so that
// options of any type (or none) pass through unchanged.
func withRuntime(r containers.RuntimeInfo) client.NewContainerOpts {
	return func(_ context.Context, _ *client.Client, c *containers.Container) error {
		c.Runtime = r
		return nil
	}
}

// remove kills and deletes fork id's task, if any, then the container and its snapshot.
func (t *template) remove(ctx context.Context, id string) error {
	ctr, err := t.client.LoadContainer(ctx, id)
	if err != nil {
		return err
	}
	task, err := ctr.Task(ctx, nil)
	switch {
	case err == nil:
		if _, err := task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete task: %w", err)
		}
	case !errdefs.IsNotFound(err):
		return fmt.Errorf("task: %w", err)
	}
	if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		return fmt.Errorf("delete container: %w", err)
	}
	return nil
}
