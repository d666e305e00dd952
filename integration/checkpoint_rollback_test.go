package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/checkpoint"
)

// TestCheckpointRollbackLoop checkpoints a container once and rolls it back to that checkpoint 50
// times, each time after moving the counter and the filesystem past it, as an agent platform
// undoing bad actions does. Every rollback must bring back exactly the checkpoint's memory and
// files and leave nothing behind: no checkpoint, no snapshot per rollback. It logs the median
// rollback time (kill, restore, start).
func TestCheckpointRollbackLoop(t *testing.T) {
	const rounds = 50
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "agent")
	dir, _, at := e.markedCheckpoint(t, task, cnt, "base")

	took := make([]time.Duration, 0, rounds)
	snapshotsAfterFirst := 0
	for i := range rounds {
		ok := t.Run(fmt.Sprintf("rollback %d", i+1), func(t *testing.T) {
			changeMarks(t, cnt.Rootfs, fmt.Sprint(i))
			cnt.advance(t, 2)
			start := time.Now()
			e.rollback(t, c, dir)
			took = append(took, time.Since(start))
			expectRolledBack(t, cnt, at, "base")
		})
		if !ok {
			break
		}
		if i == 0 {
			snapshotsAfterFirst = len(e.snapshotNames(t))
		}
	}
	if len(took) < rounds {
		return
	}
	slices.Sort(took)
	t.Logf("rollback (kill + restore + start) over %d rounds: median %.1f ms, min %.1f ms, max %.1f ms", rounds,
		ms(took[rounds/2]), ms(took[0]), ms(took[rounds-1]))
	if n := len(e.snapshotNames(t)); n != snapshotsAfterFirst {
		t.Fatalf("cklite holds %d snapshots after %d rollbacks, %d after the first: each rollback leaves snapshots behind", n, rounds, snapshotsAfterFirst)
	}
	if recs := e.records(t); len(recs) != 1 {
		t.Fatalf("%d checkpoints (%v) after one checkpoint and %d rollbacks, want 1: a rollback is not a checkpoint", len(recs), recordIDs(recs), rounds)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// snapshotNames lists the snapshots containerd knows on cklite.
func (e *ckEnv) snapshotNames(t *testing.T) []string {
	t.Helper()
	var names []string
	if err := e.sn.Walk(e.ctx, func(_ context.Context, info snapshots.Info) error {
		names = append(names, info.Name)
		return nil
	}); err != nil {
		t.Fatalf("listing cklite's snapshots: %v", err)
	}
	return names
}

// TestCheckpointTree builds a tree of checkpoints: A, run, B, roll back to A, run, C. B and C are
// both children of A (in cklite.json, in the leases and in the snapshot chain) and each of the
// three can be restored afterwards, in an order that crosses branches.
func TestCheckpointTree(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "tree")
	type node struct {
		name string
		dir  string
		m    checkpoint.Meta
		at   workload.Count
	}
	take := func(name string) node {
		t.Helper()
		dir, m, at := e.markedCheckpoint(t, task, cnt, name)
		return node{name, dir, m, at}
	}
	run := func(from node) {
		t.Helper()
		changeMarks(t, cnt.Rootfs, from.name)
		cnt.advance(t, 3)
	}

	a := take("A")
	if a.m.Parent != "" {
		t.Fatalf("the first checkpoint of a container has parent %q, want none", a.m.Parent)
	}
	run(a)
	b := take("B")
	e.expectParent(t, b.m, a.m)
	task = e.rollback(t, c, a.dir)
	expectRolledBack(t, cnt, a.at, "A")
	run(a)
	cc := take("C")
	e.expectParent(t, cc.m, a.m)

	for _, n := range []node{a, b, cc} {
		if r := e.record(t, n.m.ID); r.Parent != n.m.Parent {
			t.Fatalf("the lease of checkpoint %s (%s) names parent %q, want %q", n.name, n.m.ID, r.Parent, n.m.Parent)
		}
	}
	for _, n := range []node{b, a, cc, b} {
		run(n)
		e.rollback(t, c, n.dir)
		expectRolledBack(t, cnt, n.at, n.name)
	}
}

// TestCheckpointPaused checkpoints a paused task, leaving it running: it must still be paused
// afterwards (the client resumes only a task it paused itself) and not count, then count on from
// where it stopped once resumed. Restored, the checkpoint counts on from where it was paused.
func TestCheckpointPaused(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "paused")
	writeMarks(t, cnt.Rootfs, "paused")
	first := cnt.advance(t, 1)
	// Counting freely from here on: the pause catches it mid-count.
	if err := os.WriteFile(filepath.Join(cnt.Rootfs, "tmp", "run"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cnt.waitFor(t, "counting", func(x workload.Count) bool { return x.N > first.N })
	if err := task.Pause(e.ctx); err != nil {
		t.Fatalf("pausing: %v", err)
	}
	e.expectStatus(t, task, client.Paused, "after Pause")
	frozen := cnt.waitFor(t, "a count", func(workload.Count) bool { return true })

	dir := checkpointDir(t, e.d, "paused")
	// A work directory of the client's outlives the checkpoint, and with it what the shim put
	// there for the restore of a paused task.
	e.checkpointTo(t, task, dir, &options.CheckpointOptions{WorkPath: t.TempDir()})
	e.expectStatus(t, task, client.Paused, "after a checkpoint of the paused task")
	// Seeing that nothing happens takes time: 25 rounds of the counter's loop.
	time.Sleep(500 * time.Millisecond)
	if now := cnt.waitFor(t, "a count", func(workload.Count) bool { return true }); now != frozen {
		t.Fatalf("the counter went from %+v to %+v across the checkpoint of the paused task: the task ran during or after the checkpoint, though paused", frozen, now)
	}

	if err := task.Resume(e.ctx); err != nil {
		t.Fatalf("resuming after the checkpoint: %v", err)
	}
	e.expectStatus(t, task, client.Running, "after Resume")
	cnt.waitFor(t, fmt.Sprintf("the resumed counter to count on past %d with token %s", frozen.N, frozen.Token), func(x workload.Count) bool {
		return x.Token == frozen.Token && x.N > frozen.N+3
	})
	// The next checkpoint ends and restores the processes as usual: the restored paused task
	// kept no CRIU option of its restore (leave-stopped would leave the dumped processes stopped
	// and the checkpoint waiting for an exit forever).
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	again := checkpointDir(t, e.d, "paused-again")
	if _, err := task.Checkpoint(ctx, withOptions(&options.CheckpointOptions{ImagePath: again}), withUniqueName(task.ID())); err != nil {
		t.Fatalf("a checkpoint after the checkpoint of the paused task: %v", err)
	}

	changeMarks(t, cnt.Rootfs, "paused")
	restored := e.rollback(t, c, dir)
	expectMarks(t, cnt.Rootfs, "paused")
	e.expectStatus(t, restored, client.Running, "restored from the checkpoint of a paused task")
	cnt.waitFor(t, fmt.Sprintf("the restored counter to count on past %d with token %s", frozen.N, frozen.Token), func(x workload.Count) bool {
		return x.Token == frozen.Token && x.N > frozen.N+3
	})
}

// TestCheckpointContents: the annotation (or label) cklite.io/checkpoint-contents asks for half a
// checkpoint. A filesystem-only checkpoint runs no CRIU: the task is not dumped (same init) and a
// rollback starts the process afresh on the checkpoint's files. A memory-only checkpoint freezes
// no layer: a rollback restores the processes on the container's current files.
func TestCheckpointContents(t *testing.T) {
	e := newCkEnv(t)
	for _, tc := range []struct {
		contents checkpoint.Contents
		check    func(t *testing.T, dir string, m checkpoint.Meta)
		rolled   func(t *testing.T, cnt counter, at workload.Count, tag string)
	}{
		{
			contents: checkpoint.FSOnly,
			check: func(t *testing.T, dir string, m checkpoint.Meta) {
				if _, err := os.Stat(filepath.Join(dir, "inventory.img")); !os.IsNotExist(err) {
					t.Fatalf("a filesystem-only checkpoint wrote CRIU images (inventory.img: %v)", err)
				}
				if m.Frozen != checkpoint.FrozenName(m.ID) {
					t.Fatalf("filesystem-only checkpoint %s has frozen layer %q", m.ID, m.Frozen)
				}
				if _, err := e.sn.Stat(e.ctx, m.Frozen); err != nil {
					t.Fatalf("frozen layer of the filesystem-only checkpoint: %v", err)
				}
			},
			rolled: func(t *testing.T, cnt counter, at workload.Count, tag string) {
				expectMarks(t, cnt.Rootfs, tag)
				cnt.waitFor(t, "a counter started afresh", func(x workload.Count) bool { return x.Token != at.Token })
			},
		},
		{
			contents: checkpoint.MemoryOnly,
			check: func(t *testing.T, dir string, m checkpoint.Meta) {
				if m.Frozen != "" {
					t.Fatalf("memory-only checkpoint %s froze layer %q", m.ID, m.Frozen)
				}
			},
			rolled: func(t *testing.T, cnt counter, at workload.Count, tag string) {
				if _, err := os.Stat(filepath.Join(cnt.Rootfs, marksDir, "written-after-"+tag)); err != nil {
					t.Fatalf("a memory-only rollback did not keep the current files: %v", err)
				}
				cnt.expectRestored(t, at)
			},
		},
	} {
		t.Run(string(tc.contents), func(t *testing.T) {
			id := "contents-" + strings.ReplaceAll(string(tc.contents), "+", "")
			c := e.newContainer(t, id, e.img, counterSpec, oci.WithAnnotations(map[string]string{checkpoint.ContentsKey: string(tc.contents)}))
			task, err := startTask(e.ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			cnt := newCounter(e.d.RootfsPath(id))
			tag := string(tc.contents)
			writeMarks(t, cnt.Rootfs, tag)
			at := cnt.advance(t, 3)
			pid := task.Pid()
			dir := checkpointDir(t, e.d, id)
			start := time.Now()
			if err := e.checkpointErr(task, dir, nil); err != nil {
				t.Fatalf("%s checkpoint: %v", tc.contents, err)
			}
			logTiming(t, string(tc.contents)+" checkpoint", start)
			m, err := checkpoint.Read(dir)
			if err != nil {
				t.Fatal(err)
			}
			if m.Contents != tc.contents {
				t.Fatalf("checkpoint %s records contents %q, want %q", m.ID, m.Contents, tc.contents)
			}
			tc.check(t, dir, m)
			if tc.contents == checkpoint.FSOnly {
				if st, err := task.Status(e.ctx); err != nil || st.Status != client.Running {
					t.Fatalf("after a filesystem-only checkpoint the task is %+v (%v)", st, err)
				}
				if now := pidOf(t, e, task); now != pid {
					t.Fatalf("a filesystem-only checkpoint changed init's pid from %d to %d: it was dumped", pid, now)
				}
			}
			expectContinues(t, cnt, at)
			changeMarks(t, cnt.Rootfs, tag)
			e.rollback(t, c, dir)
			tc.rolled(t, cnt, at, tag)
		})
	}
}

// pidOf asks the shim (not the client's cache) for the pid of task's init.
func pidOf(t *testing.T, e *ckEnv, task client.Task) uint32 {
	t.Helper()
	st, err := e.d.Client().TaskService().Get(e.ctx, &tasks.GetRequest{ContainerID: task.ID()})
	if err != nil {
		t.Fatalf("task %s: %v", task.ID(), err)
	}
	return st.Process.Pid
}

// TestCheckpointTTL: cklite.io/checkpoint-ttl gives a checkpoint an expiry that containerd's
// collector enforces: once expired its lease is gone, but its frozen layer stays while the
// container's rootfs is stacked on it (after a rollback to it), and goes with the container. The
// layer of a checkpoint that left the task running goes with its lease: the container runs on its
// own upper, nothing stands on that layer.
func TestCheckpointTTL(t *testing.T) {
	e := newCkEnv(t)
	const id = "ttl"
	c := e.newContainer(t, id, e.img, counterSpec, oci.WithAnnotations(map[string]string{checkpoint.TTLKey: "5s"}))
	task, err := startTask(e.ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	dir := checkpointDir(t, e.d, id)
	m := e.checkpointTo(t, task, dir, nil)
	if d := m.Expires.Sub(m.Created); d != 5*time.Second {
		t.Fatalf("checkpoint %s expires %v after its creation, want 5s", m.ID, d)
	}
	e.record(t, m.ID) // listed until it expires
	task = e.rollback(t, c, dir)
	after := e.checkpointTo(t, task, checkpointDir(t, e.d, id+"-after"), nil)

	time.Sleep(time.Until(after.Expires) + time.Second)
	e.collectGarbage(t)
	for _, r := range e.records(t) {
		if r.ID == m.ID || r.ID == after.ID {
			t.Fatalf("checkpoint %s is still listed after its expiry and a garbage collection", r.ID)
		}
	}
	if _, err := e.sn.Stat(e.ctx, m.Frozen); err != nil {
		t.Fatalf("the expired checkpoint's layer went while the container's rootfs is stacked on it: %v", err)
	}
	if _, err := e.sn.Stat(e.ctx, after.Frozen); !errdefs.IsNotFound(err) {
		t.Fatalf("the layer of an expired checkpoint that nothing stands on outlives it: %v", err)
	}
	e.deleteTask(t, c)
	if err := c.Delete(e.ctx, client.WithSnapshotCleanup); err != nil {
		t.Fatal(err)
	}
	e.collectGarbage(t)
	if _, err := e.sn.Stat(e.ctx, m.Frozen); !errdefs.IsNotFound(err) {
		t.Fatalf("the expired checkpoint's layer outlives its container: %v", err)
	}
}

// collectGarbage runs containerd's collector now: deleting a lease synchronously does.
func (e *ckEnv) collectGarbage(t *testing.T) {
	t.Helper()
	l, err := e.lm.Create(e.ctx, leases.WithRandomID())
	if err == nil {
		err = e.lm.Delete(e.ctx, l, leases.SynchronousDelete)
	}
	if err != nil {
		t.Fatalf("garbage collection: %v", err)
	}
}
