package integration

// The isolation tests are issue 13's: a rollback never crosses from one container's lineage into
// another's unless asked to, and cklite's commands never act on a container of another runtime.

import (
	"strings"
	"testing"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// TestRollbackLineage: a container rolls back to its own checkpoints and to the checkpoint it was
// restored from, but not to another container's, neither through the CLI nor by a client that
// sends the shim the rollback annotation itself; --force-foreign overrides, and then the other
// container's files are there.
func TestRollbackLineage(t *testing.T) {
	e := newCkEnv(t)
	_, taskA, cntA := e.startCounter(t, "tenant-a")
	_, taskB, cntB := e.startCounter(t, "tenant-b")
	_, ka, _ := e.markedCheckpoint(t, taskA, cntA, "a")
	dirB, kb, atB := e.markedCheckpoint(t, taskB, cntB, "b")

	t.Run("another container's checkpoint is refused", func(t *testing.T) {
		pid := pidOf(t, e, taskA)
		at := cntA.advance(t, 1)
		ckliteFails(t, e.d, "checkpoint "+kb.ID+" was taken of container tenant-b", "rollback", "tenant-a", kb.ID)
		// Straight to the shim, as a client that bypasses the CLI would.
		_, err := e.d.Client().TaskService().Update(e.ctx, &tasks.UpdateTaskRequest{
			ContainerID: "tenant-a",
			Annotations: map[string]string{checkpoint.RollbackKey: dirB},
		})
		if err = errgrpc.ToNative(err); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "into tenant-a") {
			t.Fatalf("the shim answered a foreign rollback with %v, want permission denied naming both containers", err)
		}
		if got := pidOf(t, e, taskA); got != pid {
			t.Fatalf("tenant-a's init is %d after the refused rollbacks, was %d", got, pid)
		}
		e.expectStatus(t, taskA, client.Running, "after the refused rollbacks")
		expectContinues(t, cntA, at)
		expectMarks(t, cntA.Rootfs, "a")
	})

	t.Run("own checkpoint", func(t *testing.T) {
		cklite(t, e.d, "rollback", "tenant-a", ka.ID)
		e.expectStatus(t, taskA, client.Running, "after a rollback to its own checkpoint")
	})

	t.Run("the checkpoint a container was restored from", func(t *testing.T) {
		c := e.newContainer(t, "tenant-c", e.img, counterSpec)
		task, err := e.restore(c, nil, client.WithRestoreImagePath(dirB))
		if err != nil {
			t.Fatalf("restoring tenant-c from tenant-b's checkpoint: %v", err)
		}
		labels, err := c.Labels(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := labels[checkpoint.LineageKey]; got != kb.ID {
			t.Fatalf("tenant-c's lineage is %q after its restore from %s, want %q", got, kb.ID, kb.ID)
		}
		cntC := newCounter(e.d.RootfsPath("tenant-c"))
		changeMarks(t, cntC.Rootfs, "b")
		cklite(t, e.d, "rollback", "tenant-c", kb.ID)
		expectRolledBack(t, cntC, atB, "b")
		ckliteFails(t, e.d, "checkpoint "+ka.ID+" was taken of container tenant-a", "rollback", "tenant-c", ka.ID)
		e.expectStatus(t, task, client.Running, "after a refused rollback")

		// A checkpoint of tenant-c carries its lineage: what is restored from it may roll back
		// to tenant-b's checkpoint too.
		_, kc, _ := e.markedCheckpoint(t, task, cntC, "c")
		if want := kb.ID; kc.Lineage != want {
			t.Fatalf("tenant-c's checkpoint records lineage %q, want %q", kc.Lineage, want)
		}
	})

	t.Run("--force-foreign", func(t *testing.T) {
		changeMarks(t, cntA.Rootfs, "a")
		cklite(t, e.d, "rollback", "--force-foreign", "tenant-a", kb.ID)
		expectRolledBack(t, newCounter(e.d.RootfsPath("tenant-a")), atB, "b")
		e.expectStatus(t, taskA, client.Running, "after a forced rollback")
	})
}

// TestRuncContainerUntouched: cklite's rollback and checkpoint create refuse a container of the
// stock runc runtime before asking anything of its task (the runc shim crashes on a rollback
// annotation and takes the container with it), and change nothing: same init, still running,
// same labels.
func TestRuncContainerUntouched(t *testing.T) {
	e := newCkEnv(t)
	_, taskA, cntA := e.startCounter(t, "cklite-ctr")
	_, ka, _ := e.markedCheckpoint(t, taskA, cntA, "a")

	c := newBusyboxContainer(t, e.ctx, e.d, runcRuntime, "with-runc", counterSpec)
	task, err := startTask(e.ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	pid := pidOf(t, e, task)
	labels, err := c.Labels(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"rollback", "with-runc", ka.ID},
		{"rollback", "--force-foreign", "with-runc", ka.ID},
		{"checkpoint", "create", "with-runc"},
		{"checkpoint", "create", "--fs-only", "--ttl", "1h", "with-runc"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			before := e.leaseIDs(t)
			ckliteFails(t, e.d, "container with-runc runs on "+runcRuntime+"; cklite checkpoints, rolls back and forks only containers of runtime "+checkpoint.Runtime, args...)
			if got := pidOf(t, e, task); got != pid {
				t.Fatalf("with-runc's init is %d, was %d", got, pid)
			}
			e.expectStatus(t, task, client.Running, "after cklite refused it")
			if err := task.Kill(e.ctx, 0); err != nil { // signal 0: the process is there
				t.Fatalf("with-runc's init: %v", err)
			}
			after, err := c.Labels(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(after) != len(labels) {
				t.Fatalf("with-runc's labels are %v, were %v", after, labels)
			}
			if got := e.leaseIDs(t); len(got) != len(before) {
				t.Fatalf("leases %v after the refusal, %v before", got, before)
			}
		})
	}
}
