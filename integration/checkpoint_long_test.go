package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cklite/cklite/integration/workload"
)

// longCheckpoints is the number of checkpoints TestCheckpointLong takes: CKLITE_LONG_CHECKPOINTS
// (`make test-long` sets 300); unset, the test is skipped (`make test` runs the short
// TestCheckpointStdioIdentity instead).
func longCheckpoints(t *testing.T) int {
	if os.Getenv("CKLITE_LONG_CHECKPOINTS") == "" {
		t.Skip("CKLITE_LONG_CHECKPOINTS is not set (make test-long)")
	}
	return envInt(t, "CKLITE_LONG_CHECKPOINTS", 0, 30)
}

// longRound is one checkpoint of TestCheckpointLong: where the counter stood and which blob was
// the last written.
type longRound struct {
	dir, id string
	at      workload.Count
	blob    int
}

// TestCheckpointLong is the 1000th-checkpoint test of issue 16: a container started by `ctr run
// -d` (the client gone, stdio on FIFOs) whose shell forks short-lived processes all the time, 1 MB
// written before each checkpoint, an in-place rollback every 10 checkpoints (to the checkpoint 5
// back) and a fork at a third and two thirds. Each checkpoint must succeed and be recorded, each
// rollback bring back that checkpoint's counter and files, each fork start from its checkpoint.
// Before the stdio fix, every checkpoint failed from about the 100th on ("Can't lookup mount=24
// for fd=1 path=/dev/null").
func TestCheckpointLong(t *testing.T) {
	n := longCheckpoints(t)
	e := newCkEnv(t)
	// ckTimeout bounds the short tests; this one takes 20-40 minutes on a loaded 2-core machine.
	ctx, cancel := context.WithTimeout(e.d.Context(context.Background()), 2*time.Hour)
	defer cancel()
	e.ctx = ctx
	c, task, cnt := e.ctrRunCounter(t, "long")
	var rounds []longRound
	blob := 0
	start := time.Now()
	for i := range n {
		blob++
		writeBlob(t, cnt.Rootfs, blob)
		at := cnt.advance(t, 1)
		dir := checkpointDir(t, e.d, fmt.Sprintf("long-%d", i))
		if err := e.checkpointErr(task, dir, nil); err != nil {
			t.Fatalf("checkpoint %d of %d (after %s): %v%s", i+1, n, time.Since(start).Round(time.Second), err, criuErrors(err))
		}
		m := e.expectCheckpoint(t, dir, c.ID())
		rounds = append(rounds, longRound{dir: dir, id: m.ID, at: at, blob: blob})
		if i%10 == 9 {
			to := rounds[len(rounds)-5]
			e.rollbackInPlace(t, task, to.dir)
			cnt.expectRestored(t, to.at)
			expectBlobs(t, cnt.Rootfs, to.blob)
			blob = to.blob
		}
		if i == n/3 || i == 2*n/3 {
			e.forkAndCheck(t, rounds[len(rounds)-1], fmt.Sprintf("long-fork-%d", i))
		}
	}
	t.Logf("%d checkpoints, %d rollbacks in place and 2 forks in %s", n, n/10, time.Since(start).Round(time.Second))
}

// writeBlob writes /blobs/N, 1 MB, into the container's rootfs.
func writeBlob(t *testing.T, rootfs string, n int) {
	t.Helper()
	dir := filepath.Join(rootfs, "blobs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte(fmt.Sprintf("%08d", n)), 1<<17)
	if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(n)), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// expectBlobs checks the rootfs holds blob last and none written after it.
func expectBlobs(t *testing.T, rootfs string, last int) {
	t.Helper()
	dir := filepath.Join(rootfs, "blobs")
	data, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(last)))
	if err != nil || !bytes.HasPrefix(data, []byte(fmt.Sprintf("%08d", last))) || len(data) != 1<<20 {
		t.Fatalf("blob %d after rolling back to it: %d bytes, %v", last, len(data), err)
	}
	if _, err := os.Stat(filepath.Join(dir, strconv.Itoa(last+1))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("blob %d, written after the checkpoint rolled back to, is still there (%v)", last+1, err)
	}
}

// forkAndCheck forks checkpoint r into one new container (named prefix-1) with the cklite CLI,
// checks it restored r's counter and files, and removes it.
func (e *ckEnv) forkAndCheck(t *testing.T, r longRound, prefix string) {
	t.Helper()
	out := cklite(t, e.d, "fork", "-n", "1", "--prefix", prefix, r.id)
	var name string
	for _, l := range strings.Split(out, "\n") {
		if sub := forkLineRE.FindStringSubmatch(l); sub != nil {
			name = sub[1]
		}
	}
	if name == "" {
		t.Fatalf("cklite fork printed no running fork:\n%s", out)
	}
	id := forkIDsByName(t, e, []string{name})[0]
	fork := newCounter(e.d.RootfsPath(id))
	fork.expectRestored(t, r.at)
	expectBlobs(t, fork.Rootfs, r.blob)
	mustCtr(t, e.d, "tasks", "delete", "-f", id)
	mustCtr(t, e.d, "containers", "delete", id)
}
