package integration

import (
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
)

// TestCheckpointImageDirReused checkpoints into an image directory that already holds a
// checkpoint: the second checkpoint must be refused, naming the directory, with the task running
// on and nothing recorded, and the first checkpoint must stay listed once and restorable. Before,
// both were listed and neither could be rolled back to (issue 16 item 5).
func TestCheckpointImageDirReused(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "reused")
	dir, first, at := e.markedCheckpoint(t, task, cnt, "first")
	before := e.records(t)

	changeMarks(t, cnt.Rootfs, "first")
	now := cnt.advance(t, 2)
	err := e.checkpointErr(task, dir, nil)
	if err == nil || !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "not empty") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("a second checkpoint into %s: %v; want AlreadyExists naming the directory as not empty", dir, err)
	}
	e.expectStatus(t, task, client.Running, "after a refused checkpoint")
	expectContinues(t, cnt, now)
	if after := e.records(t); len(after) != len(before) {
		t.Fatalf("%d checkpoints listed after the refused one, %d before: %v", len(after), len(before), recordIDs(after))
	}
	if m := e.expectCheckpoint(t, dir, c.ID()); m.ID != first.ID {
		t.Fatalf("%s holds checkpoint %s after the refused one, want the first, %s", dir, m.ID, first.ID)
	}
	e.rollbackInPlace(t, task, dir)
	expectRolledBack(t, cnt, at, "first")
}
