package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	runcopts "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"
	imagespec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/shimproc"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/checkpoint"
)

const runcRuntime = "io.containerd.runc.v2"

// sandbox is one container of the benchmark on one system, and the operations measured on it.
// Every checkpoint is kept until close, so that any of them can be rolled back to or forked.
type sandbox interface {
	rootfs() string
	// checkpoint takes checkpoint i (memory + filesystem), leaving the container running.
	checkpoint(i int) error
	// rollback brings the container back to checkpoint i.
	rollback(i int) error
	// fork starts n new containers from checkpoint i and returns their ids and how long each took.
	fork(i, n int, prefix string) ([]string, []time.Duration, error)
	// diskDirs are the directories holding this system's snapshots and checkpoint images.
	diskDirs() []string
	// close removes the container, its checkpoints and what they hold on disk.
	close() error
}

// start creates container id on runtime and snapshotter, running the busybox counter with the
// probe next to it (holding memMB of memory), and starts its task.
func (e *env) start(id, runtime, snapshotter string, memMB int) (client.Container, client.Task, error) {
	script := fmt.Sprintf("probe -mem %d & %s", memMB, workload.CounterScript)
	return e.d.Run(e.ctx, id, e.img, runtime, snapshotter, "sh", "-c", script)
}

func (e *env) newTask(c client.Container, opts ...client.NewTaskOpts) (client.Task, error) {
	return e.d.StartTask(e.ctx, c, opts...)
}

func (e *env) remove(id string) error { return e.d.Remove(e.ctx, id) }

// shimPeak is the peak resident memory (VmHWM, bytes) of the shim serving container id, 0 when
// none is found.
func (e *env) shimPeak(id string) uint64 {
	pids := shimproc.Find(e.d.Address, id)
	var peak uint64
	for _, pid := range pids {
		if m, err := shimproc.ReadMemory(pid); err == nil {
			peak = max(peak, m.Peak)
		}
	}
	return peak
}

// ckliteBox is a container on cklite: runtime io.containerd.cklite.v2 on cklite-snapshotter.
// Checkpoints go straight to the task service with an image directory, as `cklite checkpoint
// create` does (the Go client's Task.Checkpoint would pause the task around it and build an image
// with a rootfs diff cklite does not need); rollback is in place (`cklite rollback`: a task Update
// with the rollback annotation), fork is `cklite fork`.
type ckliteBox struct {
	*env
	id   string
	dirs map[int]string // image directory by checkpoint
	ids  map[int]string // cklite checkpoint id by checkpoint
}

func (e *env) newCklite(id string, memMB int) (*ckliteBox, error) {
	if _, _, err := e.start(id, harness.CkliteRuntime, ckliteSnapshotter, memMB); err != nil {
		return nil, err
	}
	return &ckliteBox{env: e, id: id, dirs: map[int]string{}, ids: map[int]string{}}, nil
}

func (s *ckliteBox) rootfs() string { return s.d.RootfsPath(s.id) }

func (s *ckliteBox) imageRoot() string { return filepath.Join(s.d.Dir, "checkpoints", s.id) }

func (s *ckliteBox) checkpoint(i int) error {
	dir := filepath.Join(s.imageRoot(), fmt.Sprint(i))
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	opts, err := typeurl.MarshalAnyToProto(&runcopts.CheckpointOptions{ImagePath: dir})
	if err != nil {
		return err
	}
	if _, err := s.d.Client().TaskService().Checkpoint(s.ctx, &tasks.CheckpointTaskRequest{ContainerID: s.id, Options: opts}); err != nil {
		return errgrpc.ToNative(err)
	}
	m, err := checkpoint.Read(dir)
	if err != nil {
		return err
	}
	s.dirs[i], s.ids[i] = dir, m.ID
	return nil
}

func (s *ckliteBox) rollback(i int) error {
	_, err := s.d.Client().TaskService().Update(s.ctx, &tasks.UpdateTaskRequest{
		ContainerID: s.id,
		Annotations: map[string]string{checkpoint.RollbackKey: s.dirs[i]},
	})
	return errgrpc.ToNative(err)
}

// forkLineRE is the line `cklite fork` prints as each fork runs.
var forkLineRE = regexp.MustCompile(`^  (\S+) running, restored in (\S+)$`)

func (s *ckliteBox) fork(i, n int, prefix string) ([]string, []time.Duration, error) {
	out, err := s.d.Cklite(s.ctx, "fork", "-n", fmt.Sprint(n), "--prefix", prefix, "--cleanup-on-error", s.ids[i])
	if err != nil {
		return nil, nil, err
	}
	var ids []string
	var took []time.Duration
	for _, l := range strings.Split(out, "\n") {
		if m := forkLineRE.FindStringSubmatch(l); m != nil {
			d, err := time.ParseDuration(m[2])
			if err != nil {
				return ids, nil, fmt.Errorf("cklite fork printed %q: %w", l, err)
			}
			ids, took = append(ids, m[1]), append(took, d)
		}
	}
	if len(ids) != n {
		return ids, nil, fmt.Errorf("cklite fork -n %d printed %d forks:\n%s", n, len(ids), out)
	}
	return ids, took, nil
}

func (s *ckliteBox) diskDirs() []string {
	return []string{filepath.Join(s.d.Dir, "cklite-snapshotter"), s.imageRoot()}
}

func (s *ckliteBox) close() error {
	if err := s.remove(s.id); err != nil {
		return err
	}
	var ids []string
	for _, id := range s.ids {
		ids = append(ids, id)
	}
	if len(ids) > 0 {
		// --gc: the frozen layers go now, not at some later collection, so the next workload's
		// disk measurement starts from a clean snapshotter.
		if _, err := s.d.Cklite(s.ctx, append([]string{"checkpoint", "rm", "--gc"}, ids...)...); err != nil {
			return err
		}
	}
	return os.RemoveAll(s.imageRoot())
}

// stockBox is a container on containerd's runc shim and overlayfs, driven as ctr drives it: a
// checkpoint is `ctr containers checkpoint --task --rw` (pause, CRIU dump and rw diff into a
// checkpoint image, resume); a rollback is `ctr containers restore --live --rw` (the container is
// made again from the checkpoint image, its rw diff applied onto a fresh snapshot).
type stockBox struct {
	*env
	id     string
	images map[int]client.Image
}

func (e *env) newStock(id string, memMB int) (*stockBox, error) {
	if _, _, err := e.start(id, runcRuntime, "overlayfs", memMB); err != nil {
		return nil, err
	}
	return &stockBox{env: e, id: id, images: map[int]client.Image{}}, nil
}

func (s *stockBox) rootfs() string { return s.d.RootfsPath(s.id) }

func (s *stockBox) checkpoint(i int) error {
	c, err := s.d.Client().LoadContainer(s.ctx, s.id)
	if err != nil {
		return err
	}
	task, err := c.Task(s.ctx, nil)
	if err != nil {
		return err
	}
	if err := task.Pause(s.ctx); err != nil {
		return err
	}
	img, err := c.Checkpoint(s.ctx, fmt.Sprintf("checkpoint/%s:%d", s.id, i),
		client.WithCheckpointRuntime, client.WithCheckpointTask, client.WithCheckpointRW)
	if rerr := task.Resume(s.ctx); err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	s.images[i] = img
	return nil
}

func (s *stockBox) rollback(i int) error {
	if err := s.remove(s.id); err != nil {
		return err
	}
	_, err := s.restore(s.id, i, nil)
	return err
}

// restore makes container id from checkpoint i, with its rw layer, and restores its task. opts
// change the restored container before it is created.
func (s *stockBox) restore(id string, i int, opt client.RestoreOpts) (client.Container, error) {
	ropts := []client.RestoreOpts{client.WithRestoreImage, client.WithRestoreSpec, client.WithRestoreRuntime, client.WithRestoreRW}
	if opt != nil {
		ropts = append(ropts, opt)
	}
	c, err := s.d.Client().Restore(s.ctx, id, s.images[i], ropts...)
	if err != nil {
		return nil, err
	}
	if _, err := s.newTask(c, client.WithTaskCheckpoint(s.images[i])); err != nil {
		_ = c.Delete(s.ctx, client.WithSnapshotCleanup)
		return nil, err
	}
	return c, nil
}

// fork restores checkpoint i into n new containers while the original runs, one after the other
// (what a script around `ctr containers restore` would do). The restored spec names the
// original's cgroup, where runc refuses to restore ("container's cgroup is not empty"), so each
// fork gets a cgroup of its own, the one change to what the checkpoint recorded.
func (s *stockBox) fork(i, n int, prefix string) ([]string, []time.Duration, error) {
	var ids []string
	var took []time.Duration
	for k := 1; k <= n; k++ {
		id := fmt.Sprintf("%s-%d", prefix, k)
		start := time.Now()
		if _, err := s.restore(id, i, ownCgroup(s.d.Namespace, id)); err != nil {
			return ids, took, fmt.Errorf("fork %s: %w", id, err)
		}
		ids, took = append(ids, id), append(took, time.Since(start))
	}
	return ids, took, nil
}

// ownCgroup points the restored container's spec at the cgroup containerd would give a new
// container id (/NAMESPACE/ID), instead of the checkpointed container's.
func ownCgroup(namespace, id string) client.RestoreOpts {
	return func(context.Context, string, *client.Client, client.Image, *imagespec.Index) client.NewContainerOpts {
		return func(_ context.Context, _ *client.Client, c *containers.Container) error {
			var spec oci.Spec
			if err := typeurl.UnmarshalTo(c.Spec, &spec); err != nil {
				return err
			}
			if spec.Linux != nil {
				spec.Linux.CgroupsPath = "/" + namespace + "/" + id
			}
			any, err := typeurl.MarshalAnyToProto(&spec)
			if err != nil {
				return err
			}
			c.Spec = any
			return nil
		}
	}
}

func (s *stockBox) diskDirs() []string {
	return []string{
		filepath.Join(s.d.Root, "io.containerd.snapshotter.v1.overlayfs"),
		filepath.Join(s.d.Root, "io.containerd.content.v1.content"),
	}
}

func (s *stockBox) close() error {
	if err := s.remove(s.id); err != nil {
		return err
	}
	for _, img := range s.images {
		// Synchronous: the garbage collection that frees the checkpoints' content runs now.
		if err := s.d.Client().ImageService().Delete(s.ctx, img.Name(), images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}
