package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestRollbackLimits: a rollback in place keeps the cgroup limits the task has, not the spec's: a
// task Update between the checkpoint and the rollback (what `nerdctl update --memory` and the
// kubelet's in-place resize send) is carried across, the limits it changed and the ones it left
// as they were. A rollback takes the sandbox's processes and files back, not the platform's
// decisions about its resources: the kubelet would otherwise believe in limits no longer applied.
func TestRollbackLimits(t *testing.T) {
	e := newCkEnv(t)
	_, task, cnt := e.startCounter(t, "limits")
	files := []string{"memory/memory.limit_in_bytes", "memory/memory.soft_limit_in_bytes", "pids/pids.max", "cpu/cpu.shares"}
	initial := cgroupValues(t, e, "limits", files)
	_, k, at := e.markedCheckpoint(t, task, cnt, "a")

	memory, reservation, pids, shares := int64(96<<20), int64(64<<20), int64(77), uint64(333)
	if err := task.Update(e.ctx, client.WithResources(&specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &memory, Reservation: &reservation},
		Pids:   &specs.LinuxPids{Limit: &pids},
		CPU:    &specs.LinuxCPU{Shares: &shares},
	})); err != nil {
		t.Fatalf("update: %v", err)
	}
	updated := cgroupValues(t, e, "limits", files)
	for i, want := range []string{fmt.Sprint(memory), fmt.Sprint(reservation), fmt.Sprint(pids), fmt.Sprint(shares)} {
		if updated[i] != want {
			t.Fatalf("%s is %s after the update, want %s", files[i], updated[i], want)
		}
	}

	changeMarks(t, cnt.Rootfs, "a")
	cklite(t, e.d, "rollback", "limits", k.ID)
	expectRolledBack(t, cnt, at, "a")
	after := cgroupValues(t, e, "limits", files)
	for i := range files {
		if after[i] != updated[i] {
			t.Errorf("%s is %s after the rollback, was updated to %s (%s at the start)", files[i], after[i], updated[i], initial[i])
		}
	}
}

// cgroupValues reads files (CONTROLLER/FILE) of the cgroup v1 hierarchies container id's init
// is in.
func cgroupValues(t *testing.T, e *ckEnv, id string, files []string) []string {
	t.Helper()
	data := forkCgroups(t, e, id)
	var values []string
	for _, f := range files {
		controller, file, _ := strings.Cut(f, "/")
		dir := ""
		for _, line := range strings.Split(data, "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) == 3 && strings.Contains(","+parts[1]+",", ","+controller+",") {
				dir = parts[2]
			}
		}
		if dir == "" {
			t.Skipf("no cgroup v1 %s hierarchy for the task", controller)
		}
		v, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", controller, dir, file))
		if err != nil {
			t.Fatal(err)
		}
		values = append(values, strings.TrimSpace(string(v)))
	}
	return values
}
