package shim

import (
	"context"
	"errors"
	"os"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"

	"github.com/cklite/cklite/runtime"
)

// A cgroup that could not be loaded when the init started is loaded by the next Stats instead of
// leaving the container without metrics for the rest of its life.
func TestStatsAfterFailedCgroupLoad(t *testing.T) {
	loads := 0
	c := &container{id: "c", init: newProcess("c", true, stdio{})}
	c.cgroupOf = func(pid int) (*runtime.Cgroup, error) {
		loads++
		if loads == 1 {
			return nil, errors.New("cgroups: cgroup mountpoint does not exist")
		}
		return runtime.LoadCgroup(pid)
	}
	c.init.started(nil, os.Getpid(), statusRunning) // the test's own cgroup stands in for the container's
	s := &service{containers: map[string]*container{c.id: c}}

	if _, err := c.loadCgroup(); err == nil {
		t.Fatal("the first load should fail")
	}
	resp, err := s.Stats(context.Background(), &taskAPI.StatsRequest{ID: c.id})
	if err != nil {
		t.Fatalf("Stats after a failed load at start: %v", err)
	}
	if resp.GetStats() == nil || len(resp.GetStats().GetValue()) == 0 {
		t.Fatalf("Stats returned no metrics: %v", resp)
	}
	if _, err := s.Stats(context.Background(), &taskAPI.StatsRequest{ID: c.id}); err != nil || loads != 2 {
		t.Fatalf("second Stats: %v after %d loads, want the cgroup kept after the second load", err, loads)
	}
}
