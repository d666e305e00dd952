package integration

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// TestCLIRemoveSubtree is issue 18 item 4 on real checkpoints: A; B on A; C on B; a rollback to
// A; D on A. Removing B, a middle node, leaves C under A (and C whole: a rollback to it brings
// its files and count back); `checkpoint ls` marks the checkpoint the container runs on; `rm -r`
// of A's subtree is refused while the container runs on C, and with --force removes C, D and A,
// children first, the container running on.
func TestCLIRemoveSubtree(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "sub")
	aDir, a, _ := e.markedCheckpoint(t, task, cnt, "A")
	changeMarks(t, cnt.Rootfs, "A")
	_, b, _ := e.markedCheckpoint(t, task, cnt, "B")
	changeMarks(t, cnt.Rootfs, "B")
	_, cc, cAt := e.markedCheckpoint(t, task, cnt, "C")
	task = e.rollback(t, c, aDir)
	changeMarks(t, cnt.Rootfs, "A")
	_, d, _ := e.markedCheckpoint(t, task, cnt, "D")
	e.expectParent(t, cc, b)
	e.expectParent(t, d, a)

	if out := cklite(t, e.d, "checkpoint", "rm", b.ID); out != b.ID+"\n" {
		t.Fatalf("checkpoint rm %s printed %q", b.ID, out)
	}
	var listed []struct {
		ID     string `json:"id"`
		Parent string `json:"parent"`
	}
	if err := json.Unmarshal([]byte(cklite(t, e.d, "checkpoint", "ls", "--format", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 3 || listed[1].ID != cc.ID || listed[1].Parent != a.ID {
		t.Fatalf("after removing B, checkpoint ls --format json lists %+v; want C (%s) with parent A (%s)", listed, cc.ID, a.ID)
	}
	expectRows(t, cklite(t, e.d, "checkpoint", "ls"), []string{a.ID, "├─ " + cc.ID, "└─ " + d.ID}, "◀ sub", 2)

	// C, its parent's layer unnamed now, is whole.
	cklite(t, e.d, "rollback", "sub", cc.ID[:6])
	expectRolledBack(t, cnt, cAt, "C")
	expectRows(t, cklite(t, e.d, "checkpoint", "ls"), []string{a.ID, "├─ " + cc.ID, "└─ " + d.ID}, "◀ sub", 1)

	ckliteFails(t, e.d, "the subtree holds the state of running containers (sub runs on "+cc.ID+")", "checkpoint", "rm", "-r", a.ID)
	if ids := recordIDs(e.records(t)); !slices.Equal(ids, []string{a.ID, cc.ID, d.ID}) {
		t.Fatalf("a refused rm -r left checkpoints %v, want A, C, D", ids)
	}
	ckliteMisuse(t, e.d, "--force goes with -r", "checkpoint", "rm", "--force", a.ID)

	out := cklite(t, e.d, "checkpoint", "rm", "-r", "--force", "--gc", a.ID[:8])
	if want := cc.ID + "\n" + d.ID + "\n" + a.ID + "\n"; out != want {
		t.Fatalf("checkpoint rm -r --force printed %q, want C, D, A (children first)", out)
	}
	if ids := recordIDs(e.records(t)); len(ids) != 0 {
		t.Fatalf("after rm -r of the root, checkpoints %v are left", ids)
	}
	expectContinues(t, cnt, cAt)
	// The container's rootfs is stacked on C's layer, and C's on B's and A's: they stay. D's
	// layer nothing uses: --gc freed it.
	for _, m := range [][2]string{{"A", a.Frozen}, {"B", b.Frozen}, {"C", cc.Frozen}} {
		if _, err := e.sn.Stat(e.ctx, m[1]); err != nil {
			t.Fatalf("%s's frozen layer, under the running container's rootfs, is gone: %v", m[0], err)
		}
	}
	if _, err := e.sn.Stat(e.ctx, d.Frozen); !errdefs.IsNotFound(err) {
		t.Fatalf("D's frozen layer is still there after rm -r --gc (stat: %v)", err)
	}
}

// expectRows checks that `checkpoint ls` printed out: rows starting with prefixes, the one at
// index marked ending with mark and no other row carrying "◀".
func expectRows(t *testing.T, out string, prefixes []string, mark string, marked int) {
	t.Helper()
	rows := lsRows(t, out)
	ok := len(rows) == len(prefixes)
	for i := 0; ok && i < len(rows); i++ {
		ok = strings.HasPrefix(rows[i], prefixes[i]+" ") && strings.HasSuffix(rows[i], mark) == (i == marked) &&
			strings.Contains(rows[i], "◀") == (i == marked)
	}
	if !ok {
		t.Fatalf("checkpoint ls printed\n%s\nwant rows %q, the one at %d marked %q", out, prefixes, marked, mark)
	}
}
