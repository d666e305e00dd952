package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/checkpoint"
)

// TestCheckpointLeaveRunningRollback: a Go-client checkpoint of a cklite task captures memory and
// filesystem, leaves the task running, and a restore rolls both back.
func TestCheckpointLeaveRunningRollback(t *testing.T) {
	e := newFSEnv(t)
	ctx := e.ctx
	c, err := e.d.Client().NewContainer(ctx, "ck", client.WithSnapshotter(ckliteSnapshotter),
		client.WithNewSnapshot("ck-rootfs", e.img), client.WithRuntime(harness.CkliteRuntime, nil),
		client.WithNewSpec(oci.WithImageConfig(e.img), oci.WithProcessArgs("sh", "-c", workload.CounterScript)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup)
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	counter := workload.Counter{Rootfs: e.d.RootfsPath("ck")}
	at, err := counter.Advance(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	rootfs := e.d.RootfsPath("ck")
	if err := os.WriteFile(filepath.Join(rootfs, "before"), []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	start := time.Now()
	if _, err := task.Checkpoint(ctx, client.WithCheckpointImagePath(dir)); err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint (leave running) took %s", time.Since(start))
	meta, err := checkpoint.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint %+v", meta)
	if err := counter.ExpectRestored(ctx, at); err != nil {
		t.Fatalf("after a leave-running checkpoint: %v", err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "after"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := task.Delete(ctx, client.WithProcessKill); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	task, err = c.NewTask(ctx, cio.NullIO, client.WithRestoreImagePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("rollback took %s", time.Since(start))
	defer task.Delete(context.WithoutCancel(ctx), client.WithProcessKill)
	if err := counter.ExpectRestored(ctx, at); err != nil {
		t.Fatalf("after rollback: %v", err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "after")); !os.IsNotExist(err) {
		t.Fatalf("a file written after the checkpoint survived the rollback: %v", err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "before")); err != nil {
		t.Fatalf("a file written before the checkpoint is gone after the rollback: %v", err)
	}
}

// TestCheckpointForkWhileRunning: three new containers restored from one checkpoint run at once
// next to the original, each on its own upper over the shared frozen layer.
func TestCheckpointForkWhileRunning(t *testing.T) {
	e := newFSEnv(t)
	ctx := e.ctx
	newCounter := func(id string, opts ...client.NewTaskOpts) (client.Task, workload.Counter) {
		c, err := e.d.Client().NewContainer(ctx, id, client.WithSnapshotter(ckliteSnapshotter),
			client.WithNewSnapshot(id+"-rootfs", e.img), client.WithRuntime(harness.CkliteRuntime, nil),
			client.WithNewSpec(oci.WithImageConfig(e.img), oci.WithProcessArgs("sh", "-c", workload.CounterScript)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup) })
		task, err := c.NewTask(ctx, cio.NullIO, opts...)
		if err != nil {
			t.Fatalf("creating %s: %v", id, err)
		}
		t.Cleanup(func() { task.Delete(context.WithoutCancel(ctx), client.WithProcessKill) })
		if err := task.Start(ctx); err != nil {
			t.Fatalf("starting %s: %v", id, err)
		}
		return task, workload.Counter{Rootfs: e.d.RootfsPath(id)}
	}
	task, counter := newCounter("orig")
	at, err := counter.Advance(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := task.Checkpoint(ctx, client.WithCheckpointImagePath(dir)); err != nil {
		t.Fatal(err)
	}
	var forks []workload.Counter
	for _, id := range []string{"fork-1", "fork-2", "fork-3"} {
		start := time.Now()
		_, fc := newCounter(id, client.WithRestoreImagePath(dir))
		t.Logf("%s restored in %s", id, time.Since(start))
		forks = append(forks, fc)
	}
	for i, fc := range forks {
		if err := fc.ExpectRestored(ctx, at); err != nil {
			t.Fatalf("fork %d: %v", i+1, err)
		}
		if err := os.WriteFile(filepath.Join(fc.Rootfs, "mine"), []byte(fc.Rootfs), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, fc := range forks {
		if got, err := os.ReadFile(filepath.Join(fc.Rootfs, "mine")); err != nil || string(got) != fc.Rootfs {
			t.Fatalf("fork %d sees %q (%v), not its own write", i+1, got, err)
		}
	}
	if _, err := os.Stat(filepath.Join(counter.Rootfs, "mine")); !os.IsNotExist(err) {
		t.Fatalf("the original sees a fork's write: %v", err)
	}
	if err := counter.ExpectRestored(ctx, at); err != nil {
		t.Fatalf("the original after the forks: %v", err)
	}
}

// TestCheckpointNerdctl: nerdctl checkpoint create leaves a cklite task running; nerdctl start
// --checkpoint rolls memory and filesystem back.
func TestCheckpointNerdctl(t *testing.T) {
	d := startDaemon(t, harness.Config{CkliteSnapshotter: true})
	if err := d.Import(context.Background(), busybox); err != nil {
		t.Fatal(err)
	}
	nerdctl(t, d, "--snapshotter", ckliteSnapshotter, "run", "-d", "--net", "none", "--runtime", harness.CkliteRuntime,
		"--name", "nc", busybox.Name, "sh", "-c", workload.CounterScript)
	id := inspect(t, d, "nc", "{{.ID}}")
	counter := workload.Counter{Rootfs: d.RootfsPath(id)}
	ctx := context.Background()
	at, err := counter.Advance(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	nerdctl(t, d, "checkpoint", "create", "nc", "ck1")
	t.Logf("nerdctl checkpoint create: %s", time.Since(start))
	if err := counter.ExpectRestored(ctx, at); err != nil {
		t.Fatalf("after nerdctl checkpoint create: %v", err)
	}
	if err := os.WriteFile(filepath.Join(counter.Rootfs, "after"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	nerdctl(t, d, "stop", "-t", "0", "nc")
	start = time.Now()
	nerdctl(t, d, "start", "--checkpoint", "ck1", "nc")
	t.Logf("nerdctl start --checkpoint: %s", time.Since(start))
	if err := counter.ExpectRestored(ctx, at); err != nil {
		t.Fatalf("after nerdctl start --checkpoint: %v", err)
	}
	if _, err := os.Stat(filepath.Join(counter.Rootfs, "after")); !os.IsNotExist(err) {
		t.Fatalf("a file written after the checkpoint survived nerdctl start --checkpoint: %v", err)
	}
}

// TestCheckpointCtrContainers: ctr containers checkpoint --task --rw, then restore --live --rw
// into a new name while the original runs (a fork), and into the original name.
func TestCheckpointCtrContainers(t *testing.T) {
	e := newFSEnv(t)
	d := e.d
	ctr(t, d, "run", "-d", "--snapshotter", ckliteSnapshotter, "--runtime", harness.CkliteRuntime, "--fifo-dir", d.FIFODir(),
		busybox.Name, "cc", "sh", "-c", workload.CounterScript)
	counter := workload.Counter{Rootfs: d.RootfsPath("cc")}
	ctx := context.Background()
	at, err := counter.Advance(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ctr(t, d, "containers", "checkpoint", "--task", "--rw", "cc", "ck/cc:1")
	t.Logf("ctr containers checkpoint --task --rw: %s", time.Since(start))
	if err := counter.ExpectRestored(ctx, at); err != nil {
		t.Fatalf("after ctr containers checkpoint: %v", err)
	}
	start = time.Now()
	ctr(t, d, "containers", "restore", "--live", "--rw", "cc-fork", "ck/cc:1")
	t.Logf("ctr containers restore --live --rw NEWNAME: %s", time.Since(start))
	fork := workload.Counter{Rootfs: d.RootfsPath("cc-fork")}
	if err := fork.ExpectRestored(ctx, at); err != nil {
		t.Fatalf("the fork: %v", err)
	}
	if err := os.WriteFile(filepath.Join(counter.Rootfs, "after"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ctr(t, d, "tasks", "kill", "-s", "SIGKILL", "cc")
	eventually(t, "cc's task to be deleted", func() error {
		if r := ctrResult(t, d, "", "tasks", "delete", "cc"); r.code != 0 {
			return fmt.Errorf("ctr tasks delete: %s", r.stderr)
		}
		return nil
	})
	ctr(t, d, "containers", "delete", "cc")
	start = time.Now()
	ctr(t, d, "containers", "restore", "--live", "--rw", "cc", "ck/cc:1")
	t.Logf("ctr containers restore --live --rw (same name): %s", time.Since(start))
	if err := counter.ExpectRestored(ctx, at); err != nil {
		t.Fatalf("restored under the original name: %v", err)
	}
	if _, err := os.Stat(filepath.Join(counter.Rootfs, "after")); !os.IsNotExist(err) {
		t.Fatalf("a file written after the checkpoint survived the restore: %v", err)
	}
}
