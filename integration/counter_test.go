package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// counterScript is the workload of the checkpoint tests. It keeps a counter in shell memory and
// writes "TOKEN N STATE" to /tmp/count on every round. TOKEN is drawn at start, so a process that
// was restarted instead of restored shows a new one. The counter only advances while /tmp/run
// exists (STATE "run"); without it the process idles (STATE "idle") and keeps rewriting its value,
// so a test can hold the counter still, checkpoint it, and later see exactly that value again.
const counterScript = `t=$(cat /proc/sys/kernel/random/uuid); i=0
while :; do
  if [ -e /tmp/run ]; then i=$((i+1)); s=run; else s=idle; fi
  echo "$t $i $s" > /tmp/count.new && mv /tmp/count.new /tmp/count
  sleep 0.02
done`

// counter drives counterScript through the container's root filesystem as the host sees it.
type counter struct{ rootfs string }

type count struct {
	token   string
	n       int
	running bool
}

func (c counter) read() (count, error) {
	data, err := os.ReadFile(filepath.Join(c.rootfs, "tmp", "count"))
	if err != nil {
		return count{}, err
	}
	var x count
	var state string
	if _, err := fmt.Sscanf(strings.TrimSpace(string(data)), "%s %d %s", &x.token, &x.n, &state); err != nil {
		return count{}, fmt.Errorf("parsing %q: %w", data, err)
	}
	x.running = state == "run"
	return x, nil
}

// waitFor polls the counter until ok holds.
func (c counter) waitFor(t *testing.T, what string, ok func(count) bool) count {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last count
	var err error
	for time.Now().Before(deadline) {
		if last, err = c.read(); err == nil && ok(last) {
			return last
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("counter in %s: timed out waiting for %s; last read %+v (err %v)", c.rootfs, what, last, err)
	return count{}
}

// advance lets the counter run until it has counted at least n more, then holds it still and
// returns where it stopped.
func (c counter) advance(t *testing.T, n int) count {
	t.Helper()
	start := c.waitFor(t, "a first count", func(count) bool { return true })
	if err := os.WriteFile(filepath.Join(c.rootfs, "tmp", "run"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, fmt.Sprintf("count >= %d", start.n+n), func(x count) bool { return x.token == start.token && x.n >= start.n+n })
	if err := os.Remove(filepath.Join(c.rootfs, "tmp", "run")); err != nil {
		t.Fatal(err)
	}
	// Every round that starts after the removal writes "idle", and only such rounds do.
	return c.waitFor(t, "the counter to idle", func(x count) bool { return !x.running })
}

// expectRestored checks the process holds the memory it had at checkpoint: the same token and
// exactly the checkpointed count, and that it keeps counting from there.
func (c counter) expectRestored(t *testing.T, at count) {
	t.Helper()
	c.waitFor(t, fmt.Sprintf("the checkpointed state %+v", at), func(x count) bool { return x == at })
	if got := c.advance(t, 3); got.token != at.token || got.n < at.n+3 {
		t.Fatalf("after restore the counter went from %+v to %+v", at, got)
	}
}

func logTiming(t *testing.T, what string, start time.Time) {
	t.Helper()
	t.Logf("timing: %-55s %8.1f ms", what, float64(time.Since(start).Microseconds())/1000)
}
