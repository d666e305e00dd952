package integration

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
)

// TestConcurrentCheckpoints checkpoints 16 containers at once, leaving them running, for 2 rounds
// (CKLITE_CONCURRENT_ROUNDS: `make test-long` runs 10): on 2 cores the shim's cgroup freeze used
// to give up ("pause: unable to freeze", 2 of 32) where it must retry for a while (issue 16 item
// 8). Every checkpoint must succeed and every counter run on.
func TestConcurrentCheckpoints(t *testing.T) {
	const containers = 16
	rounds := envInt(t, "CKLITE_CONCURRENT_ROUNDS", 2, 1)
	e := newCkEnv(t)
	tasks := make([]client.Task, containers)
	counters := make([]counter, containers)
	for i := range containers {
		_, tasks[i], counters[i] = e.startCounter(t, fmt.Sprintf("conc-%d", i))
	}
	for round := range rounds {
		start := time.Now()
		errs := make([]error, containers)
		var wg sync.WaitGroup
		for i, task := range tasks {
			dir := checkpointDir(t, e.d, fmt.Sprintf("conc-%d-%d", i, round))
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := e.checkpointErr(task, dir, nil); err != nil {
					errs[i] = fmt.Errorf("checkpoint of %s: %w%s", task.ID(), err, criuErrors(err))
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d of %d concurrent checkpoints:\n%v", round+1, containers, err)
		}
		t.Logf("round %d: %d concurrent checkpoints in %s", round+1, containers, time.Since(start).Round(time.Millisecond))
		for _, c := range counters {
			c.advance(t, 1)
		}
	}
}
