package integration

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/cklite/cklite/integration/shimproc"
)

// TestCRIUReady follows the CRIU a shim starts ahead of a container's next dump
// (runtime/criuready.go): none before the container's first checkpoint; after each leave-running
// checkpoint one, idle (tracing nothing), never two, a new one each time (the one before served
// the dump: the dump driver took it); a rollback in place hands the replaced engine's to the new
// engine (kept running, none started), and the next checkpoint takes it; the task's delete ends
// the last one.
// Every checkpoint leaves the counter running on.
func TestCRIUReady(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "criu-ready")
	shims := shimproc.Find(e.d.Address, task.ID())
	if len(shims) != 1 {
		t.Fatalf("shims of %s: %v, want one", task.ID(), shims)
	}
	shim := shims[0]
	if r := criuChildren(shim); len(r) != 0 {
		t.Fatalf("CRIU %v runs for a container never checkpointed", r)
	}
	var served []int
	var dirs []string
	for i := range 3 {
		at := cnt.advance(t, 1)
		dir := checkpointDir(t, e.d, fmt.Sprintf("criu-ready-%d", i))
		e.checkpointTo(t, task, dir, nil)
		dirs = append(dirs, dir)
		expectContinues(t, cnt, at)
		ready := oneReadyCRIU(t, shim, task.Pid(), served)
		served = append(served, ready)
	}
	e.rollbackInPlace(t, task, dirs[1])
	// The CRIU started ahead for the engine the rollback replaced is the new engine's: kept
	// across, not ended and another started; the checkpoint after the rollback takes it.
	if r := criuChildren(shim); len(r) != 1 || r[0] != served[2] {
		t.Fatalf("CRIU children of the shim after the rollback in place: %v, want %d alone, started ahead before it", r, served[2])
	}
	at := cnt.advance(t, 1)
	e.checkpointTo(t, task, checkpointDir(t, e.d, "criu-ready-after-rollback"), nil)
	expectContinues(t, cnt, at)
	last := oneReadyCRIU(t, shim, task.Pid(), served)
	e.deleteTask(t, c)
	eventually(t, "the last CRIU started ahead to be gone with the task", func() error {
		if criuAlive(last) {
			return fmt.Errorf("CRIU %d runs on after the task's delete", last)
		}
		return nil
	})
}

// criuChildren are shim's children that are CRIU and have not exited.
func criuChildren(shim int) []int {
	var r []int
	for _, pid := range childrenOf(shim) {
		if criuAlive(pid) {
			r = append(r, pid)
		}
	}
	return r
}

// oneReadyCRIU waits for shim to have exactly one CRIU child, not among before and tracing
// nothing of the task (init's pid: its tracer), and returns it.
func oneReadyCRIU(t *testing.T, shim int, init uint32, before []int) int {
	t.Helper()
	var ready int
	eventually(t, "one CRIU started ahead of the next dump", func() error {
		r := criuChildren(shim)
		switch {
		case len(r) != 1:
			return fmt.Errorf("CRIU children %v, want one", r)
		case slices.Contains(before, r[0]):
			return fmt.Errorf("CRIU %d, started ahead of a dump already done, is still there", r[0])
		case tracerOf(init) == r[0]:
			return errors.New("the CRIU still traces the task")
		}
		ready = r[0]
		return nil
	})
	return ready
}
