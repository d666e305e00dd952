package integration

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cklite/cklite/integration/shimproc"
)

// execWarmUp execs run before the shim's fds and memory are first read: the first execs grow
// the shim's goroutine stacks, ttrpc buffers and Go heap to their working size.
const execWarmUp = 100

// maxExecGrowth bounds how much the shim's anonymous resident memory may grow from the warm-up
// to the last exec: a leak of 1 KiB an exec is 10 MB over 10 000 execs; Go's heap and stacks
// move by a few MB with garbage collection alone.
const maxExecGrowth = 6 << 20

// TestExecsMany: CKLITE_EXECS sequential execs (300 here, 10 000 in make test-long) in a
// container whose PID 1 is `sleep`, which never reaps: every exec exits 0, the zombies stay
// within the bound of TestExecZombiesBounded (the shim takes the execs back as its own children
// once it sees PID 1 not reaping), and the shim's open fds and its anonymous memory are the same
// after the last exec as after the warm-up.
func TestExecsMany(t *testing.T) {
	n := envInt(t, "CKLITE_EXECS", 300, execWarmUp+1)
	e := newCkEnv(t)
	// ckTimeout bounds the short tests; 10 000 execs take 10-30 minutes on a loaded 2-core machine.
	ctx, cancel := context.WithTimeout(e.d.Context(context.Background()), 2*time.Hour)
	defer cancel()
	e.ctx = ctx
	c := e.newContainer(t, "execs-many", e.img, oci.WithProcessArgs("sleep", "1000000"))
	task, err := startTask(e.ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	shims := shimproc.Find(e.d.Address, c.ID())
	if len(shims) != 1 {
		t.Fatalf("shims of %s: %v, want one", c.ID(), shims)
	}
	shim := shims[0]
	var fds0 int
	var mem0 shimproc.Memory
	for i := 1; i <= n; i++ {
		e.expectExecExit(t, task, 0, "true", 0)
		if i == execWarmUp {
			fds0, mem0 = openFds(t, shim), readMemory(t, shim)
		}
	}
	// An exec's fds are closed by the time its Delete returns: the count is exact.
	fds, mem := openFds(t, shim), readMemory(t, shim)
	zombies := zombieChildren(t, int(task.Pid()))
	t.Logf("%d execs: shim fds %d -> %d, anonymous memory %.1f -> %.1f MiB (RSS %.1f -> %.1f), %d zombies under PID 1",
		n, fds0, fds, mib(mem0.Anon), mib(mem.Anon), mib(mem0.RSS), mib(mem.RSS), zombies)
	if fds != fds0 {
		t.Errorf("the shim holds %d fds after %d execs, %d after %d: a leak", fds, n, fds0, execWarmUp)
	}
	if mem.Anon > mem0.Anon+maxExecGrowth {
		t.Errorf("the shim's anonymous memory grew %.1f MiB from exec %d to exec %d, want at most %.0f", mib(mem.Anon-mem0.Anon), execWarmUp, n, mib(maxExecGrowth))
	}
	if zombies > maxExecZombies {
		t.Errorf("%d zombies under a non-reaping PID 1 after %d execs, want at most %d", zombies, n, maxExecZombies)
	}
}

func openFds(t *testing.T, pid int) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

func readMemory(t *testing.T, pid int) shimproc.Memory {
	t.Helper()
	m, err := shimproc.ReadMemory(pid)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
