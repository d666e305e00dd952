package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/checkpoint"
)

const runcRuntime = "io.containerd.runc.v2"

// start creates container id running the counter workload with the given runtime and
// snapshotter, and starts its task.
func (e *env) start(id, runtime, snapshotter string) (client.Container, client.Task, error) {
	return e.d.Run(e.ctx, id, e.img, runtime, snapshotter, "sh", "-c", workload.CounterScript)
}

// newTask creates and starts c's task with opts (a restore, when they name a checkpoint).
func (e *env) newTask(c client.Container, opts ...client.NewTaskOpts) (client.Task, error) {
	return e.d.StartTask(e.ctx, c, opts...)
}

func (e *env) remove(id string) error { return e.d.Remove(e.ctx, id) }

func (e *env) deleteTask(c client.Container) error { return e.d.DeleteTask(e.ctx, c) }

// checkFork checks fork id holds the checkpoint of round rep, the agent at `at`, then removes it.
func (e *env) checkFork(id string, at workload.Count, rep int) error {
	if err := expectCheckpointed(e.ctx, e.d.RootfsPath(id), at, rep, e.mb); err != nil {
		return fmt.Errorf("fork %s: %w", id, err)
	}
	return e.remove(id)
}

// cklite is the agent on cklite. A checkpoint is the plain Go client call with an image
// directory; the shim freezes the rootfs in the same instant as CRIU's dump.
type cklite struct {
	*env
	id        string
	container client.Container
	task      client.Task
	dir       string // the image directory of the last checkpoint
	last      checkpoint.Meta
}

func (e *env) newCklite(id string) (*cklite, error) {
	c, task, err := e.start(id, harness.CkliteRuntime, ckliteSnapshotter)
	if err != nil {
		return nil, err
	}
	return &cklite{env: e, id: id, container: c, task: task}, nil
}

func (s *cklite) rootfs() string { return s.d.RootfsPath(s.id) }

func (s *cklite) checkpoint(rep int) error {
	dir := filepath.Join(s.d.Dir, "checkpoints", fmt.Sprintf("%s-%d", s.id, rep))
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	// The Go client also makes a checkpoint image for any runtime but runc; its default name has
	// a resolution of one second, so each round names its own.
	_, err := s.task.Checkpoint(s.ctx, client.WithCheckpointImagePath(dir), client.WithCheckpointName(fmt.Sprintf("checkpoint/%s:%d", s.id, rep)))
	if err != nil {
		return err
	}
	if s.last, err = checkpoint.Read(dir); err != nil {
		return err
	}
	s.dir = dir
	return nil
}

func (s *cklite) rollback() error {
	if err := s.deleteTask(s.container); err != nil {
		return err
	}
	task, err := s.newTask(s.container, client.WithRestoreImagePath(s.dir))
	if err != nil {
		return err
	}
	s.task = task
	return nil
}

// forkLineRE is the line `cklite fork` prints as each fork runs.
var forkLineRE = regexp.MustCompile(`^  (\S+) running, restored in (\S+)$`)

// fork runs `cklite fork -n 3` on the last checkpoint while the agent runs on, and takes each
// fork's time from what it prints.
func (s *cklite) fork(rep int, at workload.Count, say sayFunc) ([]time.Duration, error) {
	args := []string{"fork", "-n", fmt.Sprint(forks), "--prefix", fmt.Sprintf("%s-r%d", s.id, rep), s.last.ID[:12]}
	say("fork %d sandboxes from the checkpoint while the agent runs on:", forks)
	say("$ cklite %s", strings.Join(args, " "))
	out, err := s.d.Cklite(s.ctx, args...)
	if err != nil {
		return nil, err
	}
	var took []time.Duration
	var ids []string
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		say("  %s", l)
		if m := forkLineRE.FindStringSubmatch(l); m != nil {
			d, err := time.ParseDuration(m[2])
			if err != nil {
				return nil, fmt.Errorf("cklite fork printed %q: %w", l, err)
			}
			took = append(took, d)
			ids = append(ids, m[1])
		}
	}
	if len(ids) != forks {
		return nil, fmt.Errorf("cklite fork -n %d printed %d forks:\n%s", forks, len(ids), out)
	}
	now, err := workload.Counter{Rootfs: s.rootfs()}.Read()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if err := s.checkFork(id, at, rep); err != nil {
			return nil, err
		}
	}
	say("  each fork has the checkpoint's files and counts on from %d (same token); the agent ran on at %d", at.N, now.N)
	return took, nil
}

// stock is the agent on containerd's runc shim and overlayfs. A checkpoint is what `ctr
// containers checkpoint --task --rw` does: pause, CRIU dump and rw diff into a checkpoint
// image, resume. A rollback is `ctr containers restore --live --rw`: the container is made again
// from the checkpoint image, its rw diff applied onto a fresh snapshot, its task restored by CRIU.
type stock struct {
	*env
	id        string
	container client.Container
	task      client.Task
	image     client.Image // the last checkpoint
	// refused is how stock refused to fork while the original runs.
	refused string
}

func (e *env) newStock(id string) (*stock, error) {
	c, task, err := e.start(id, runcRuntime, "overlayfs")
	if err != nil {
		return nil, err
	}
	return &stock{env: e, id: id, container: c, task: task}, nil
}

func (s *stock) rootfs() string { return s.d.RootfsPath(s.id) }

func (s *stock) checkpoint(rep int) error {
	if err := s.task.Pause(s.ctx); err != nil {
		return err
	}
	img, err := s.container.Checkpoint(s.ctx, fmt.Sprintf("checkpoint/%s:%d", s.id, rep),
		client.WithCheckpointRuntime, client.WithCheckpointTask, client.WithCheckpointRW)
	if rerr := s.task.Resume(s.ctx); err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	// The previous checkpoint (and its rw diff) is no longer needed.
	if s.image != nil {
		if err := s.d.Client().ImageService().Delete(s.ctx, s.image.Name()); err != nil {
			return err
		}
	}
	s.image = img
	return nil
}

func (s *stock) rollback() error {
	if err := s.remove(s.id); err != nil {
		return err
	}
	c, task, err := s.restore(s.id)
	if err != nil {
		return err
	}
	s.container, s.task = c, task
	return nil
}

// restore makes container id from the last checkpoint, with its rw layer, and restores its task.
func (s *stock) restore(id string) (client.Container, client.Task, error) {
	c, err := s.d.Client().Restore(s.ctx, id, s.image,
		client.WithRestoreImage, client.WithRestoreSpec, client.WithRestoreRuntime, client.WithRestoreRW)
	if err != nil {
		return nil, nil, err
	}
	task, err := s.newTask(c, client.WithTaskCheckpoint(s.image))
	if err != nil {
		_ = c.Delete(s.ctx, client.WithSnapshotCleanup)
		return nil, nil, err
	}
	return c, task, nil
}

// fork first asks stock to restore the checkpoint into a new container while the agent runs,
// which it cannot do (the restored spec names the agent's cgroup); then stops the agent, restores
// one fork in its place, and afterwards rolls the agent back again, untimed.
func (s *stock) fork(rep int, at workload.Count, say sayFunc) ([]time.Duration, error) {
	id := fmt.Sprintf("%s-r%d-fork", s.id, rep)
	if rep == 1 {
		say("fork: restore the checkpoint into a new container while the agent runs ...")
		_, _, err := s.restore(id)
		if err == nil {
			// Not expected; measured below like any other fork.
			say("  it worked: stock forked while the original runs")
			if err := s.checkFork(id, at, rep); err != nil {
				return nil, err
			}
		} else {
			s.refused = firstLine(err.Error())
			say("  refused: %s", s.refused)
			if err := s.remove(id); err != nil {
				return nil, err
			}
		}
	}
	if err := s.deleteTask(s.container); err != nil {
		return nil, err
	}
	start := time.Now()
	if _, _, err := s.restore(id); err != nil {
		return nil, fmt.Errorf("restoring %s with the agent stopped: %w", id, err)
	}
	took := time.Since(start)
	say("%-62s %9s", "fork with the agent stopped, into "+id, ms(took))
	if err := s.checkFork(id, at, rep); err != nil {
		return nil, err
	}
	if err := s.rollback(); err != nil {
		return nil, fmt.Errorf("restoring the agent after its fork: %w", err)
	}
	return []time.Duration{took}, nil
}

// firstLine shortens an error for the table's footnote: its first line, at most 200 bytes.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
