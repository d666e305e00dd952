package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
)

// TestBaselineCheckpointRestore runs the stock checkpoint flows of ctr, nerdctl and the Go client
// with containerd's runc shim and overlayfs: the baseline cklite is measured against. Each flow
// checkpoints a counting container, moves it past the checkpoint, and restores it; the counter
// must come back at exactly its checkpointed value and keep counting.
func TestBaselineCheckpointRestore(t *testing.T) {
	d := startDaemon(t, harness.Config{})
	if err := d.Import(context.Background(), busybox); err != nil {
		t.Fatal(err)
	}

	t.Run("ctr tasks checkpoint, Go client restore", func(t *testing.T) {
		const id = "ctr-task"
		ctrRun(t, d, "-d", "--runtime", "io.containerd.runc.v2", busybox.Name, id, "sh", "-c", workload.CounterScript)
		c := newCounter(d.RootfsPath(id))
		at := c.advance(t, 3)

		start := time.Now()
		name := strings.TrimSpace(ctr(t, d, "tasks", "checkpoint", id))
		logTiming(t, "ctr tasks checkpoint (leave running)", start)
		c.advance(t, 3)

		ctx := d.Context(context.Background())
		container, err := d.Client().LoadContainer(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		killTask(ctx, t, container)
		img, err := d.Client().GetImage(ctx, name)
		if err != nil {
			t.Fatalf("checkpoint image %q: %v", name, err)
		}
		start = time.Now()
		task, err := container.NewTask(ctx, cio.NullIO, client.WithTaskCheckpoint(img))
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Start(ctx); err != nil {
			t.Fatal(err)
		}
		logTiming(t, "Go client NewTask(WithTaskCheckpoint) + Start", start)
		c.expectRestored(t, at)
	})

	t.Run("ctr containers checkpoint --task --rw, restore --live --rw", func(t *testing.T) {
		const id, ref = "ctr-container", "checkpoint/ctr-container:1"
		ctrRun(t, d, "-d", "--runtime", "io.containerd.runc.v2", busybox.Name, id, "sh", "-c", workload.CounterScript)
		c := newCounter(d.RootfsPath(id))
		at := c.advance(t, 3)

		start := time.Now()
		ctr(t, d, "containers", "checkpoint", "--task", "--rw", id, ref)
		logTiming(t, "ctr containers checkpoint --task --rw", start)
		// Past the checkpoint: count further and change the filesystem; a rw restore undoes both.
		c.advance(t, 3)
		if err := os.WriteFile(filepath.Join(c.Rootfs, "after-checkpoint"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		ctr(t, d, "tasks", "delete", "--force", id)
		ctr(t, d, "containers", "delete", id)

		start = time.Now()
		ctr(t, d, "containers", "restore", "--live", "--rw", id, ref)
		logTiming(t, "ctr containers restore --live --rw", start)
		c.expectRestored(t, at)
		if _, err := os.Stat(filepath.Join(c.Rootfs, "after-checkpoint")); !os.IsNotExist(err) {
			t.Fatalf("a file written after the checkpoint survived the rw restore (stat: %v)", err)
		}
	})

	t.Run("nerdctl checkpoint create, nerdctl start --checkpoint", func(t *testing.T) {
		const name, ckpt = "nerdctl-ckpt", "ck1"
		nerdctl(t, d, "run", "-d", "--name", name, "--net", "none", busyboxRef, "sh", "-c", workload.CounterScript)
		id := strings.TrimSpace(nerdctl(t, d, "inspect", "-f", "{{.ID}}", name))
		c := newCounter(d.RootfsPath(id))
		at := c.advance(t, 3)

		start := time.Now()
		nerdctl(t, d, "checkpoint", "create", name, ckpt)
		logTiming(t, "nerdctl checkpoint create (task exits)", start)
		if out := nerdctl(t, d, "checkpoint", "ls", name); !strings.Contains(out, ckpt) {
			t.Fatalf("nerdctl checkpoint ls does not list %s:\n%s", ckpt, out)
		}

		start = time.Now()
		_, err := d.Nerdctl(context.Background(), "start", "--checkpoint", ckpt, name)
		if err != nil && strings.Contains(err.Error(), "content digest") && strings.Contains(err.Error(), "not found") {
			// Known nerdctl race: the blob it re-tars from the checkpoint directory is identical to
			// the one `checkpoint create` just released, and containerd's GC may collect it meanwhile.
			t.Logf("nerdctl start --checkpoint hit the content GC race, retrying once: %v", err)
			start = time.Now()
			_, err = d.Nerdctl(context.Background(), "start", "--checkpoint", ckpt, name)
		}
		if err != nil {
			t.Fatal(err)
		}
		logTiming(t, "nerdctl start --checkpoint", start)
		c.expectRestored(t, at)
	})
}

// killTask kills container's task and deletes it, waiting for the exit.
func killTask(ctx context.Context, t *testing.T, container client.Container) {
	t.Helper()
	task, err := container.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	exitC, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exitC
	if _, err := task.Delete(ctx); err != nil {
		t.Fatal(err)
	}
}
