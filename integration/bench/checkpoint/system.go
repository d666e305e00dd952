package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	"github.com/cklite/cklite/pkg/checkpoint"
)

const runcRuntime = "io.containerd.runc.v2"

// system is the seam between the workloads and a system under test: the workloads start
// sandboxes through it and drive them only through the sandbox interface, so a test can run every
// workload on a fake system and inject failures into its operations (see selftest_test.go). The
// real systems are cklite and stock on the harness's containerd (daemon).
type system interface {
	// start creates container id running agent a and starts its task.
	start(id string, a agentSpec) (sandbox, error)
	// resetPeak starts a new high-water mark of the memory of the system's own long-lived process
	// (cklite-snapshotter); peak reads it, 0 for a system without one (stock's snapshotter runs
	// inside containerd).
	resetPeak()
	peak() uint64
}

// sandbox is one container of the benchmark on one system, and the operations measured on it.
// Every checkpoint is kept until close, so that any of them can be rolled back to or forked.
type sandbox interface {
	id() string
	rootfs() string
	// checkpoint takes checkpoint i (memory + filesystem), leaving the container running.
	checkpoint(i int) error
	// criu is CRIU's account of checkpoint i.
	criu(i int) (criuStats, error)
	// rollback brings the container back to checkpoint i.
	rollback(i int) error
	// fork starts n new containers from checkpoint i and returns them and how long each took.
	// After an error the forks it started are removed.
	fork(i, n int, prefix string) ([]sandbox, []time.Duration, error)
	// diskDirs are the directories holding this system's snapshots and checkpoint images.
	diskDirs() []string
	// fsDisk is the part of the disk use that holds filesystem state, not CRIU images.
	fsDisk() (int64, error)
	// exec runs args in the container as an exec process and waits for it to exit 0.
	exec(args ...string) error
	// startExec starts args as an exec process without stdio and returns its pid.
	startExec(args ...string) (uint32, error)
	// execsRunning checks that the exec'd processes pids run on.
	execsRunning(pids []uint32) error
	// shimPeak is the peak resident memory (bytes) of the shim serving the container, 0 if unknown.
	shimPeak() uint64
	// close removes the container, its checkpoints and what they hold on disk.
	close() error
}

// daemon is the harness's containerd with both systems: what the real sandboxes share.
type daemon struct {
	d       *harness.Daemon
	ctx     context.Context // in the daemon's namespace
	img     client.Image    // busybox with the probe
	sandbox client.Image    // the debootstrap + python3 sandbox, for the python agent
	snapPID int             // cklite-snapshotter's, found on first use
}

// systems are cklite and stock on d, by name.
func (d *daemon) systems() map[string]system {
	return map[string]system{"cklite": ckliteSystem{d}, "stock": stockSystem{d}}
}

type ckliteSystem struct{ *daemon }

func (s ckliteSystem) start(id string, a agentSpec) (sandbox, error) { return s.newCklite(id, a) }
func (s ckliteSystem) resetPeak()                                    { s.resetSnapshotterPeak() }
func (s ckliteSystem) peak() uint64                                  { return s.snapshotterPeak() }

type stockSystem struct{ *daemon }

func (s stockSystem) start(id string, a agentSpec) (sandbox, error) { return s.newStock(id, a) }
func (stockSystem) resetPeak()                                      {}
func (stockSystem) peak() uint64                                    { return 0 }

// start creates container id on runtime and snapshotter, running agent a, and starts its task;
// a container whose task did not start is removed.
func (e *daemon) start(id, runtime, snapshotter string, a agentSpec) error {
	img := e.img
	if a.kind == pythonAgent {
		img = e.sandbox
	}
	if _, _, err := e.d.Run(e.ctx, id, img, runtime, snapshotter, a.args()...); err != nil {
		return errors.Join(err, e.remove(id))
	}
	return nil
}

func (e *daemon) newTask(c client.Container, opts ...client.NewTaskOpts) (client.Task, error) {
	return e.d.StartTask(e.ctx, c, opts...)
}

// remove removes container id with its task and snapshot. It runs to the end after an interrupt
// too (^C cancels e.ctx), so that the benchmark's clean-up leaves nothing running.
func (e *daemon) remove(id string) error { return e.d.Remove(context.WithoutCancel(e.ctx), id) }

// ckliteBox is a container on cklite: runtime io.containerd.cklite.v2 on cklite-snapshotter.
// Checkpoints go straight to the task service with an image directory, as `cklite checkpoint
// create` does (the Go client's Task.Checkpoint would pause the task around it and build an image
// with a rootfs diff cklite does not need); rollback is in place (`cklite rollback`: a task Update
// with the rollback annotation), fork is `cklite fork`. The image directories are in cklite's
// checkpoints directory of the namespace, where `cklite checkpoint create` puts them, so that the
// shim stores their memory as what changed since the parent's (pkg/pagechain).
type ckliteBox struct {
	*daemon
	cid    string
	ckRoot string         // cklite's checkpoints directory of the namespace
	dirs   map[int]string // image directory by checkpoint
	ids    map[int]string // cklite checkpoint id by checkpoint
}

func (e *daemon) newCklite(id string, a agentSpec) (*ckliteBox, error) {
	inst, err := e.d.Instance(e.ctx)
	if err != nil {
		return nil, err
	}
	root, err := inst.NamespaceCheckpoints(e.d.Namespace)
	if err != nil {
		return nil, err
	}
	if err := e.start(id, harness.CkliteRuntime, ckliteSnapshotter, a); err != nil {
		return nil, err
	}
	return &ckliteBox{daemon: e, cid: id, ckRoot: root, dirs: map[int]string{}, ids: map[int]string{}}, nil
}

func (s *ckliteBox) id() string { return s.cid }

func (s *ckliteBox) rootfs() string { return s.d.RootfsPath(s.cid) }

// imageDir is checkpoint i's image directory; imageDirs matches the container's.
func (s *ckliteBox) imageDir(i int) string {
	return filepath.Join(s.ckRoot, fmt.Sprintf("%s-ck%d", s.cid, i))
}

func (s *ckliteBox) imageDirs() string { return filepath.Join(s.ckRoot, s.cid+"-ck*") }

func (s *ckliteBox) checkpoint(i int) error {
	dir := s.imageDir(i)
	// What a failed attempt left goes: a retry writes a fresh image directory.
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	work, err := s.workDir(s.cid, i)
	if err != nil {
		return err
	}
	opts, err := typeurl.MarshalAnyToProto(&runcopts.CheckpointOptions{ImagePath: dir, WorkPath: work})
	if err != nil {
		return err
	}
	if _, err := s.d.Client().TaskService().Checkpoint(s.ctx, &tasks.CheckpointTaskRequest{ContainerID: s.cid, Options: opts}); err != nil {
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
		ContainerID: s.cid,
		Annotations: map[string]string{checkpoint.RollbackKey: s.dirs[i]},
	})
	return errgrpc.ToNative(err)
}

// forkResult is one fork of `cklite fork --format json` (docs/cli.md).
type forkResult struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	TookMs int64  `json:"tookMs"`
	Failed bool   `json:"failed"`
}

func (s *ckliteBox) fork(i, n int, prefix string) ([]sandbox, []time.Duration, error) {
	// --cleanup-on-error: after a failure cklite fork removes the forks it started.
	out, err := s.d.Cklite(s.ctx, "fork", "--format", "json", "-n", fmt.Sprint(n), "--prefix", prefix, "--cleanup-on-error", s.ids[i])
	if err != nil {
		return nil, nil, err
	}
	var results []forkResult
	if err := json.Unmarshal([]byte(out), &results); err != nil {
		return nil, nil, fmt.Errorf("cklite fork --format json printed %q: %w", out, err)
	}
	var forks []sandbox
	var took []time.Duration
	for _, r := range results {
		if !r.Failed && r.ID != "" {
			forks, took = append(forks, s.forked(r.ID)), append(took, time.Duration(r.TookMs)*time.Millisecond)
		}
	}
	if len(forks) != n {
		return nil, nil, errors.Join(fmt.Errorf("cklite fork -n %d printed %d forks:\n%s", n, len(forks), out), closeForks(forks))
	}
	return forks, took, nil
}

// forked is a fork as a sandbox of its own, with no checkpoints.
func (s *ckliteBox) forked(id string) *ckliteBox {
	return &ckliteBox{daemon: s.daemon, cid: id, ckRoot: s.ckRoot, dirs: map[int]string{}, ids: map[int]string{}}
}

func (s *ckliteBox) criu(i int) (criuStats, error) { return s.criuStats(s.cid, i) }

func (s *ckliteBox) shimPeak() uint64 { return s.daemon.shimPeak(s.cid) }

func (s *ckliteBox) exec(args ...string) error {
	_, err := s.execIn(s.cid, true, args...)
	return err
}

func (s *ckliteBox) startExec(args ...string) (uint32, error) { return s.execIn(s.cid, false, args...) }

func (s *ckliteBox) execsRunning(pids []uint32) error { return processesRunning(pids) }

// diskDirs holds the whole checkpoints directory of the namespace: the workloads checkpoint one
// cklite container at a time, and a fork writes no image directory.
func (s *ckliteBox) diskDirs() []string {
	return []string{filepath.Join(s.d.Dir, "cklite-snapshotter"), s.ckRoot}
}

func (s *ckliteBox) close() error {
	if err := s.remove(s.cid); err != nil {
		return err
	}
	var ids []string
	for _, id := range s.ids {
		ids = append(ids, id)
	}
	if len(ids) > 0 {
		// --gc: the frozen layers go now, not at some later collection, so the next workload's
		// disk measurement starts from a clean snapshotter.
		if _, err := s.d.Cklite(context.WithoutCancel(s.ctx), append([]string{"checkpoint", "rm", "--gc"}, ids...)...); err != nil {
			return err
		}
	}
	dirs, err := filepath.Glob(s.imageDirs())
	for _, dir := range dirs {
		err = errors.Join(err, os.RemoveAll(dir))
	}
	return errors.Join(err, s.removeWorkDirs(s.cid))
}

// stockBox is a container on containerd's runc shim and overlayfs, driven as ctr drives it: a
// checkpoint is `ctr containers checkpoint --task --rw` (pause, CRIU dump and rw diff into a
// checkpoint image, resume); a rollback is `ctr containers restore --live --rw` (the container is
// made again from the checkpoint image, its rw diff applied onto a fresh snapshot).
type stockBox struct {
	*daemon
	cid    string
	images map[int]client.Image
}

func (e *daemon) newStock(id string, a agentSpec) (*stockBox, error) {
	if err := e.start(id, runcRuntime, "overlayfs", a); err != nil {
		return nil, err
	}
	return &stockBox{daemon: e, cid: id, images: map[int]client.Image{}}, nil
}

func (s *stockBox) id() string { return s.cid }

func (s *stockBox) rootfs() string { return s.d.RootfsPath(s.cid) }

func (s *stockBox) checkpoint(i int) error {
	c, err := s.d.Client().LoadContainer(s.ctx, s.cid)
	if err != nil {
		return err
	}
	task, err := c.Task(s.ctx, nil)
	if err != nil {
		return err
	}
	work, err := s.workDir(s.cid, i)
	if err != nil {
		return err
	}
	if err := task.Pause(s.ctx); err != nil {
		return err
	}
	img, err := c.Checkpoint(s.ctx, fmt.Sprintf("checkpoint/%s:%d", s.cid, i),
		withWorkPath(work), client.WithCheckpointRuntime, client.WithCheckpointTask, client.WithCheckpointRW)
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
	if err := s.remove(s.cid); err != nil {
		return err
	}
	_, err := s.restore(s.cid, i, nil)
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
func (s *stockBox) fork(i, n int, prefix string) ([]sandbox, []time.Duration, error) {
	var forks []sandbox
	var took []time.Duration
	for k := 1; k <= n; k++ {
		id := fmt.Sprintf("%s-%d", prefix, k)
		start := time.Now()
		if _, err := s.restore(id, i, ownCgroup(s.d.Namespace, id)); err != nil {
			return nil, nil, errors.Join(fmt.Errorf("fork %s: %w", id, err), closeForks(forks))
		}
		forks, took = append(forks, &stockBox{daemon: s.daemon, cid: id, images: map[int]client.Image{}}), append(took, time.Since(start))
	}
	return forks, took, nil
}

func (s *stockBox) criu(i int) (criuStats, error) { return s.criuStats(s.cid, i) }

func (s *stockBox) shimPeak() uint64 { return s.daemon.shimPeak(s.cid) }

func (s *stockBox) exec(args ...string) error {
	_, err := s.execIn(s.cid, true, args...)
	return err
}

func (s *stockBox) startExec(args ...string) (uint32, error) { return s.execIn(s.cid, false, args...) }

func (s *stockBox) execsRunning(pids []uint32) error { return processesRunning(pids) }

// closeForks removes forks, all of them whatever fails.
func closeForks(forks []sandbox) error {
	var errs []error
	for _, f := range forks {
		errs = append(errs, f.close())
	}
	return errors.Join(errs...)
}

// withWorkPath has CRIU keep its logs and stats in dir, as ctr's --work-path does; it must come
// before WithCheckpointTask, which sends the options.
func withWorkPath(dir string) client.CheckpointOpts {
	return func(_ context.Context, _ *client.Client, _ *containers.Container, _ *imagespec.Index, o *runcopts.CheckpointOptions) error {
		o.WorkPath = dir
		return nil
	}
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
	if err := s.remove(s.cid); err != nil {
		return err
	}
	for _, img := range s.images {
		// Synchronous: the garbage collection that frees the checkpoints' content runs now.
		if err := s.d.Client().ImageService().Delete(context.WithoutCancel(s.ctx), img.Name(), images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return s.removeWorkDirs(s.cid)
}
