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
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
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
	// Progress, when set, is called after each fork starts or fails, one call at a time.
	Progress func(Fork, error)
	// Network gives each fork the original's networks (nerdctl's CNI setup, run again for the
	// fork: a new address each, as for a new container); otherwise a fork has loopback only.
	Network bool
}

// Fork is one started fork.
type Fork struct {
	ID   string        // random, 64 hex digits as nerdctl's: no other container's name is a prefix of it
	Name string        // its nerdctl name (label nerdctl/name)
	Took time.Duration // from creating the container to its restored task running
}

// Report is what Run did, also when some forks failed.
type Report struct {
	Forks   []Fork   // the forks running (after a failure: those that stay)
	Failed  []string // the names of the forks that failed (and were removed again)
	Removed []string // after a failure with CleanupOnError: the forks started and removed again
	Took    time.Duration
}

// Run makes opts.Count forks of src in the namespace of ctx, opts.Parallel at a time, and returns
// when all have started or failed. A fork that fails is removed and does not stop the others: the
// error names each failed fork and why, and the forks started stay unless opts.CleanupOnError.
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
	t, err := newTemplate(ctx, c, src, opts)
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
	// exists reports whether a container has id name or the nerdctl name name.
	exists(ctx context.Context, name string) (bool, error)
	// start makes fork name and starts its task, or leaves nothing of it.
	start(ctx context.Context, name string) (Fork, error)
	remove(ctx context.Context, id string) error
}

func run(ctx context.Context, f forker, names []string, opts Options) (Report, error) {
	// A name taken halfway through would fail the run after forks have started: check all first.
	for _, name := range names {
		taken, err := f.exists(ctx, name)
		if err != nil {
			return Report{}, err
		}
		if taken {
			return Report{}, fmt.Errorf("container %s already exists: choose another prefix: %w", name, errdefs.ErrAlreadyExists)
		}
	}
	began := time.Now()
	var (
		mu      sync.Mutex
		failed  = make([]error, len(names)) // by position in names, whatever order they end in
		running = make([]*Fork, len(names))
		slots   = make(chan struct{}, max(opts.Parallel, 1))
		wg      sync.WaitGroup
	)
	for i, name := range names {
		slots <- struct{}{}
		if ctx.Err() != nil {
			failed[i] = fmt.Errorf("fork %d of %d (%s): not started: %w", i+1, len(names), name, ctx.Err())
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			fk, err := f.start(ctx, name)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed[i] = fmt.Errorf("fork %d of %d (%s): %w", i+1, len(names), name, err)
			} else {
				log.G(ctx).WithField("fork", fk.ID).WithField("name", name).WithField("took", fk.Took).Debug("fork running")
				running[i] = &fk
			}
			if opts.Progress != nil {
				fk.Name = name
				opts.Progress(fk, failed[i])
			}
		}()
	}
	wg.Wait()
	var rep Report
	for i, fk := range running {
		if fk != nil {
			rep.Forks = append(rep.Forks, *fk)
		} else {
			rep.Failed = append(rep.Failed, names[i])
		}
	}
	err := errors.Join(failed...)
	if err != nil && opts.CleanupOnError {
		err = errors.Join(err, removeAll(context.WithoutCancel(ctx), f, &rep))
	}
	rep.Took = time.Since(began)
	return rep, err
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
	client    *client.Client
	namespace string
	imageDir  string
	original  containers.Container
	image     client.Image
	logDir    string
	network   bool
	store     *nerdctlStore // the original's nerdctl store, nil if nerdctl did not make it
}

func newTemplate(ctx context.Context, c *client.Client, src Source, opts Options) (*template, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
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
	t := &template{client: c, namespace: ns, imageDir: src.ImageDir, original: original, image: image, logDir: opts.LogDir, network: opts.Network}
	if st, ok := storeOf(original); ok {
		t.store = &st
	} else if opts.Network {
		return nil, fmt.Errorf("container %s was not made by nerdctl: a fork gets a network through nerdctl's CNI setup, which it has not: %w", name, errdefs.ErrFailedPrecondition)
	}
	return t, nil
}

// exists reports whether a container has id name, or name as its nerdctl name.
func (t *template) exists(ctx context.Context, name string) (bool, error) {
	_, err := t.client.ContainerService().Get(ctx, name)
	if err == nil {
		return true, nil
	}
	if !errdefs.IsNotFound(err) {
		return false, err
	}
	named, err := t.client.ContainerService().List(ctx, fmt.Sprintf("labels.%q==%q", nerdctlName, name))
	if err != nil {
		return false, err
	}
	return len(named) > 0, nil
}

func (t *template) start(ctx context.Context, name string) (_ Fork, retErr error) {
	began := time.Now()
	f := identity{id: newID(), name: name, store: t.store}
	f.hostname = f.id[:12] // as nerdctl names a container's host
	if f.store != nil {
		if err := f.store.acquire(name, f.id); err != nil {
			return Fork{}, err
		}
	}
	defer func() {
		if retErr != nil {
			if err := f.removeFiles(); err != nil {
				retErr = errors.Join(retErr, fmt.Errorf("remove the failed fork's files: %w", err))
			}
		}
	}()
	var orig oci.Spec
	if err := json.Unmarshal(t.original.Spec.GetValue(), &orig); err != nil {
		return Fork{}, fmt.Errorf("spec of the original container: %w", err)
	}
	moved, err := f.ownFiles(t.original, &orig)
	if err != nil {
		return Fork{}, err
	}
	labels := labelsFor(t.original.Labels, f, t.namespace, t.network)
	spec, err := specFor(t.original.Spec.GetValue(), f, moved, labels, t.network)
	if err != nil {
		return Fork{}, err
	}
	ctr, err := t.client.NewContainer(ctx, f.id,
		client.WithSnapshotter(t.original.Snapshotter),
		client.WithNewSnapshot(f.id, t.image),
		client.WithContainerLabels(labels),
		client.WithSpec(spec),
		withRuntime(t.original.Runtime),
	)
	if err != nil {
		return Fork{}, fmt.Errorf("create container: %w", err)
	}
	defer func() {
		if retErr != nil {
			if err := t.removeContainer(context.WithoutCancel(ctx), f.id); err != nil {
				retErr = errors.Join(retErr, fmt.Errorf("remove the failed fork: %w", err))
			}
		}
	}()
	stdio, err := t.stdio(f.id)
	if err != nil {
		return Fork{}, err
	}
	task, err := ctr.NewTask(ctx, stdio, client.WithRestoreImagePath(t.imageDir))
	if err != nil {
		return Fork{}, fmt.Errorf("restore task from %s: %w", t.imageDir, err)
	}
	if err := task.Start(ctx); err != nil {
		return Fork{}, fmt.Errorf("start restored task: %w", err)
	}
	if ownUTS(spec) && spec.Hostname != "" {
		if err := setHostname(task.Pid(), f.hostname); err != nil {
			return Fork{}, err
		}
	}
	return Fork{ID: f.id, Name: name, Took: time.Since(began)}, nil
}

// stdio is where fork id's stdout and stderr go: the log directory's file, else the original's
// nerdctl log driver (so `nerdctl logs` reads a fork as any container), else nowhere.
func (t *template) stdio(id string) (cio.Creator, error) {
	if t.logDir != "" {
		return cio.LogFile(filepath.Join(t.logDir, id+".log")), nil
	}
	if uri := t.original.Labels[nerdctlLogURI]; uri != "" && t.store != nil {
		u, err := url.Parse(uri)
		if err != nil {
			return nil, fmt.Errorf("log URI %q of container %s: %w", uri, t.original.ID, err)
		}
		return cio.LogURI(u), nil
	}
	return cio.NullIO, nil
}

// withRuntime gives a fork the original's runtime and runtime options as they are stored, so that
// options of any type (or none) pass through unchanged.
func withRuntime(r containers.RuntimeInfo) client.NewContainerOpts {
	return func(_ context.Context, _ *client.Client, c *containers.Container) error {
		c.Runtime = r
		return nil
	}
}

// remove removes fork id: its task, container and snapshot, then its files and name in nerdctl's
// store.
func (t *template) remove(ctx context.Context, id string) error {
	c, err := t.client.ContainerService().Get(ctx, id)
	if err != nil {
		return err
	}
	if err := t.removeContainer(ctx, id); err != nil {
		return err
	}
	return identity{id: id, name: c.Labels[nerdctlName], store: t.store}.removeFiles()
}

// removeContainer kills and deletes container id's task, if any, then the container and its
// snapshot.
func (t *template) removeContainer(ctx context.Context, id string) error {
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
