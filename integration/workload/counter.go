// Package workload holds the container workloads cklite's tests, demo and benchmark checkpoint,
// and the checks that tell a restored process from a restarted one.
package workload

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// CounterScript keeps a counter in shell memory and writes "TOKEN N STATE" to /tmp/count on every
// round. TOKEN is drawn at start, so a process that was restarted instead of restored shows a new
// one. The counter only advances while /tmp/run exists (STATE "run"); without it the process idles
// (STATE "idle") and keeps rewriting its value, so a caller can hold the counter still, checkpoint
// it, and later see exactly that value again.
const CounterScript = `t=$(cat /proc/sys/kernel/random/uuid); i=0
while :; do
  if [ -e /tmp/run ]; then i=$((i+1)); s=run; else s=idle; fi
  echo "$t $i $s" > /tmp/count.new && mv /tmp/count.new /tmp/count
  sleep 0.02
done`

// Counter drives CounterScript through the container's root filesystem as the host sees it.
type Counter struct{ Rootfs string }

// Count is what the counter last wrote.
type Count struct {
	Token   string
	N       int
	Running bool
}

func (c Counter) Read() (Count, error) {
	data, err := os.ReadFile(filepath.Join(c.Rootfs, "tmp", "count"))
	if err != nil {
		return Count{}, err
	}
	var x Count
	var state string
	if _, err := fmt.Sscanf(strings.TrimSpace(string(data)), "%s %d %s", &x.Token, &x.N, &state); err != nil {
		return Count{}, fmt.Errorf("parsing %q: %w", data, err)
	}
	x.Running = state == "run"
	return x, nil
}

// How long a counter may take to count as asked, and to write its first count: the first
// includes the container's start and whatever runs before the counter (a python sandbox that
// fills 256 MiB first takes well over 30 s on a loaded 2-core machine).
const (
	countTimeout = 30 * time.Second
	startTimeout = 3 * time.Minute
)

// WaitFor polls the counter until ok holds, for at most 30 seconds.
func (c Counter) WaitFor(ctx context.Context, what string, ok func(Count) bool) (Count, error) {
	return c.waitFor(ctx, what, countTimeout, ok)
}

// WaitStarted waits for the counter's first count, for at most startTimeout.
func (c Counter) WaitStarted(ctx context.Context) (Count, error) {
	return c.waitFor(ctx, "a first count", startTimeout, func(Count) bool { return true })
}

func (c Counter) waitFor(ctx context.Context, what string, limit time.Duration, ok func(Count) bool) (Count, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last Count
	var err error
	for {
		if last, err = c.Read(); err == nil && ok(last) {
			return last, nil
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("counter in %s: waiting for %s: %w; last read %+v (error %v)", c.Rootfs, what, ctx.Err(), last, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Advance lets the counter run until it has counted at least n more, then holds it still and
// returns where it stopped.
func (c Counter) Advance(ctx context.Context, n int) (Count, error) {
	start, err := c.WaitStarted(ctx)
	if err != nil {
		return Count{}, err
	}
	if err := os.WriteFile(filepath.Join(c.Rootfs, "tmp", "run"), nil, 0o644); err != nil {
		return Count{}, err
	}
	_, err = c.WaitFor(ctx, fmt.Sprintf("count >= %d", start.N+n), func(x Count) bool { return x.Token == start.Token && x.N >= start.N+n })
	if err != nil {
		return Count{}, err
	}
	if err := os.Remove(filepath.Join(c.Rootfs, "tmp", "run")); err != nil {
		return Count{}, err
	}
	// Every round that starts after the removal writes "idle", and only such rounds do.
	return c.WaitFor(ctx, "the counter to idle", func(x Count) bool { return !x.Running })
}

// ExpectRestored checks the process holds the memory it had at checkpoint, the same token and
// exactly the checkpointed count, and that it keeps counting from there.
func (c Counter) ExpectRestored(ctx context.Context, at Count) error {
	if _, err := c.WaitFor(ctx, fmt.Sprintf("the checkpointed state %+v", at), func(x Count) bool { return x == at }); err != nil {
		return err
	}
	got, err := c.Advance(ctx, 3)
	if err != nil {
		return err
	}
	if got.Token != at.Token || got.N < at.N+3 {
		return fmt.Errorf("after restore the counter went from %+v to %+v", at, got)
	}
	return nil
}
