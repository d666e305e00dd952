package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"

	client "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cklite/cklite/integration/workload"
)

// maxExecZombies bounds the zombies sequential execs leave under a PID 1 that never reaps: the
// shim gives up on the tree at the exec that finds 16 (shim's reapZombies) exits of the tree
// still zombies, or one a zombie for over a second, whichever comes first; every exec after that
// one is the shim's child, reaped by it.
const maxExecZombies = 16

// TestExecZombiesBounded: 200 sequential execs under a PID 1 that never reaps (sleep) leave at
// least one zombie (the first execs ran in the tree) and at most maxExecZombies, with exact exit
// codes; a later detached exec is the shim's child and a checkpoint is refused while it runs,
// saying PID 1 does not reap. Under a PID 1 that reaps (a shell waiting for its sleeps), the
// same execs leave the tree as it was: a detached exec after them is the init's child and a
// leave-running checkpoint keeps it running.
func TestExecZombiesBounded(t *testing.T) {
	e := newCkEnv(t)
	for _, tc := range []struct {
		name  string
		args  []string
		reaps bool
	}{
		{"non-reaping", []string{"sleep", "1000000"}, false},
		{"reaping", []string{"sh", "-c", workload.CounterScript}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.newContainer(t, "zombies-"+tc.name, e.img, oci.WithProcessArgs(tc.args...))
			task, err := startTask(e.ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			for range 200 {
				e.expectExecExit(t, task, 0, "true", 0)
			}
			zombies := zombieChildren(t, int(task.Pid()))
			t.Logf("PID 1 %q: %d zombie(s) after 200 execs", tc.args[0], zombies)
			if !tc.reaps && (zombies < 1 || zombies > maxExecZombies) {
				t.Fatalf("%d zombies under a non-reaping PID 1, want 1 to %d", zombies, maxExecZombies)
			}
			for _, want := range []uint32{0, 1, 255} {
				e.expectExecExit(t, task, 0, fmt.Sprintf("exit %d", want), want)
			}
			e.expectExecExit(t, task, 0, "kill -9 $$", 137)

			p := e.newExec(t, task, cio.NullIO, "sleep", "1000000")
			if err := p.Start(e.ctx); err != nil {
				t.Fatal(err)
			}
			if parent := parentOf(t, int(p.Pid())); (parent == int(task.Pid())) != tc.reaps {
				t.Fatalf("detached exec's parent is %d, the init is %d: in the tree = %v, want %v", parent, task.Pid(), !tc.reaps, tc.reaps)
			}
			if !tc.reaps {
				ckliteFails(t, e.d, "PID 1 does not reap", "checkpoint", "create", c.ID())
				return
			}
			cklite(t, e.d, "checkpoint", "create", c.ID())
			if st, err := p.Status(e.ctx); err != nil || st.Status != client.Running {
				t.Fatalf("detached exec after the checkpoint: %+v %v, want running", st, err)
			}
		})
	}
}

// zombieChildren counts the zombies among the children of pid (a single-threaded init).
func zombieChildren(t *testing.T, pid int) int {
	t.Helper()
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kid := range strings.Fields(string(kids)) {
		status, err := os.ReadFile("/proc/" + kid + "/status")
		if err == nil && strings.Contains(string(status), "\nState:\tZ") {
			n++
		}
	}
	return n
}
