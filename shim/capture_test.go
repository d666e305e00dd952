package shim

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/runtime"
	"github.com/cklite/cklite/snapshotter"
	"github.com/cklite/cklite/snapshotter/capture"
)

// freezerEngine is a fakeEngine with a cgroup freezer: Pause and Resume set it, a leave-running
// dump with KeepFrozen that succeeds leaves it frozen (as runtime.Container.Checkpoint does, CRIU
// freezing it or not), and a dump may thaw it (as a CRIU killed mid-dump would).
type freezerEngine struct {
	*fakeEngine
	paused, dumpThaws bool
}

func (e *freezerEngine) Pause() error  { e.paused = true; return e.call("Pause") }
func (e *freezerEngine) Resume() error { e.paused = false; return e.call("Resume") }
func (e *freezerEngine) Paused() bool  { return e.paused }
func (e *freezerEngine) Checkpoint(o runtime.CheckpointOpts) error {
	err := e.call("Checkpoint")
	switch {
	case e.dumpThaws:
		e.paused = false
	case err == nil && o.KeepFrozen && !o.Exit:
		e.paused = true
	}
	return err
}

// TestWhileFrozen: the task is frozen for the dump and the capture and thawed after, unless its
// client had paused it; a leave-running dump freezes it itself (the shim does not pause it
// first: the dump's own start stays out of the task's downtime), a dump with Exit is frozen first;
// a failed dump, a dump that thawed the cgroup and the switch rule each end the capture with the
// task as it was before the checkpoint. A capture beside the dump (CRIU held the task) is
// committed there; one after it is left to the caller to commit; a failure after the commit
// leaves the layer to the caller's Abort, which removes it.
func TestWhileFrozen(t *testing.T) {
	dumpErr := errors.New("CRIU failed")
	for _, tc := range []struct {
		name                string
		clientPaused, thaws bool
		exit, beside        bool
		dumpErr             error
		size                int   // bytes written to the upper
		fails               bool  // the capture ends without writing
		want                error // what it ends with, when known
		wantCalls           []string
	}{
		{name: "running", wantCalls: []string{"Checkpoint", "Resume"}},
		{name: "exit", exit: true, wantCalls: []string{"Pause", "Checkpoint", "Resume"}},
		{name: "paused by the client", clientPaused: true, wantCalls: []string{"Checkpoint"}},
		{name: "dump fails", dumpErr: dumpErr, fails: true, want: dumpErr, wantCalls: []string{"Checkpoint", "Resume"}},
		{name: "dump thaws", thaws: true, fails: true, wantCalls: []string{"Checkpoint", "Resume"}},
		{name: "paused with a large upper", clientPaused: true, size: switchDiffBytes + 1, fails: true, want: errSwitch, wantCalls: []string{"Checkpoint"}},
		{name: "running with a large upper", size: switchDiffBytes + 1, wantCalls: []string{"Checkpoint", "Resume"}},
		{name: "beside the dump", beside: true, wantCalls: []string{"Checkpoint", "Resume"}},
		{name: "beside the dump with exit", beside: true, exit: true, wantCalls: []string{"Pause", "Checkpoint", "Resume"}},
		{name: "beside a dump that fails", beside: true, dumpErr: dumpErr, fails: true, want: dumpErr, wantCalls: []string{"Checkpoint", "Resume"}},
		{name: "beside a dump that thaws", beside: true, thaws: true, fails: true, wantCalls: []string{"Checkpoint", "Resume"}},
		{name: "beside the dump and paused with a large upper", beside: true, clientPaused: true, size: switchDiffBytes + 1, fails: true, want: errSwitch, wantCalls: []string{"Checkpoint"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, sn := testCapture(t, tc.size)
			eng := &freezerEngine{fakeEngine: newFakeEngine(t, "c"), paused: tc.clientPaused, dumpThaws: tc.thaws}
			eng.fail["Checkpoint"] = tc.dumpErr
			ck := &checkpointRun{c: &container{eng: eng}, opts: &options.CheckpointOptions{Exit: tc.exit}}
			dump := func() error {
				return ck.c.engine().Checkpoint(runtime.CheckpointOpts{Exit: tc.exit, KeepFrozen: true})
			}
			ctx := context.Background()
			fc := &frozenCapture{cp: cp, limit: true, clientPaused: tc.clientPaused,
				prepared: func() (context.Context, error) { return ctx, nil },
				watch:    func() (seizeWaiter, error) { return nil, errors.New("no freezer cgroup") },
				commit:   func(ctx context.Context) (*capture.Record, error) { return cp.Commit(ctx, sn, nil) }}
			if tc.beside {
				fc.watch = func() (seizeWaiter, error) {
					return waiterFunc(func(<-chan struct{}) (bool, error) { return true, nil }), nil
				}
			}
			err := ck.whileFrozen(ctx, fc, dump, newSteps())
			if (err != nil) != tc.fails || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("whileFrozen: %v, want it to fail: %t (%v)", err, tc.fails, tc.want)
			}
			if eng.paused != tc.clientPaused {
				t.Fatalf("the task ends paused=%t, it was paused=%t before the checkpoint", eng.paused, tc.clientPaused)
			}
			if got := eng.called(); !slices.Equal(got, tc.wantCalls) {
				t.Fatalf("engine calls %v, want %v", got, tc.wantCalls)
			}
			committed := tc.beside && tc.want != errSwitch
			rec, cerr := fc.waitCommit(newSteps())
			if _, serr := sn.Stat(ctx, "layer"); (serr == nil) != committed || (rec != nil) != committed || cerr != nil {
				t.Fatalf("layer: %v, record %v, commit: %v; want it committed: %t", serr, rec, cerr, committed)
			}
			if err := cp.Abort(ctx, sn); err != nil && committed {
				t.Fatalf("abort: %v", err)
			}
			if _, serr := sn.Stat(ctx, "layer"); !errdefs.IsNotFound(serr) {
				t.Fatalf("layer after the abort: %v, want not found", serr)
			}
		})
	}
}

// testCapture prepares the capture of an active snapshot without parent holding size bytes, as
// the layer "layer" of the snapshotter it returns.
func testCapture(t *testing.T, size int) (*capture.Capture, *snapshotter.Snapshotter) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the snapshotter's directories")
	}
	ctx := context.Background()
	sn, err := snapshotter.New(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sn.Close() })
	ms, err := sn.Prepare(ctx, "live", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ms[0].Source, "f"), make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	cp, err := capture.Open(ctx, sn, "live", "layer", nil)
	if err == nil {
		err = cp.Prepare(ctx, sn)
	}
	if err != nil {
		t.Fatal(err)
	}
	return cp, sn
}

// waiterFunc is a seizeWaiter.
type waiterFunc func(stop <-chan struct{}) (bool, error)

func (f waiterFunc) Wait(stop <-chan struct{}) (bool, error) { return f(stop) }

// TestBesideDump: the capture runs beside the dump once the watch says CRIU holds the task, and
// the dump's end waits for it; where the watch cannot tell, or the dump ends first, it does not
// run (the caller captures after the dump).
func TestBesideDump(t *testing.T) {
	captureErr := errors.New("walk failed")
	held := waiterFunc(func(<-chan struct{}) (bool, error) { return true, nil })
	never := waiterFunc(func(stop <-chan struct{}) (bool, error) { <-stop; return false, nil })
	broken := waiterFunc(func(<-chan struct{}) (bool, error) { return false, errors.New("cgroup gone") })
	for _, tc := range []struct {
		name    string
		watch   func() (seizeWaiter, error)
		err     error // the capture's
		started bool
		wantErr error
	}{
		{name: "held", watch: func() (seizeWaiter, error) { return held, nil }, started: true},
		{name: "held, the capture fails", watch: func() (seizeWaiter, error) { return held, nil }, err: captureErr, started: true, wantErr: captureErr},
		{name: "the dump ends first", watch: func() (seizeWaiter, error) { return never, nil }},
		{name: "no watch", watch: func() (seizeWaiter, error) { return nil, errors.New("no freezer cgroup") }},
		{name: "the watch fails", watch: func() (seizeWaiter, error) { return broken, nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ran bool
			bd := startBesideDump(context.Background(), tc.watch, func() error { ran = true; return tc.err })
			started, err := bd.end()
			if started != tc.started || ran != tc.started || !errors.Is(err, tc.wantErr) || tc.wantErr == nil && err != nil {
				t.Fatalf("started %t (ran %t), %v; want started %t, %v", started, ran, err, tc.started, tc.wantErr)
			}
		})
	}
}

// TestSwitchRule: past any one of its limits a capture gives way to the in-place cycle.
func TestSwitchRule(t *testing.T) {
	for _, tc := range []struct {
		name     string
		st       capture.Stats
		paused   bool
		switches bool
	}{
		{"a few files", capture.Stats{Entries: 2000, Writes: 10, Bytes: 40 << 10, Size: 8 << 20}, false, false},
		{"entries walked", capture.Stats{Entries: switchEntries + 1, Writes: 1}, false, true},
		{"entries to write", capture.Stats{Entries: 2100, Writes: switchWrites + 1, Bytes: 4 << 20}, false, true},
		{"at the writes limit", capture.Stats{Entries: 2100, Writes: switchWrites, Bytes: 4 << 20}, false, false},
		{"bytes to write", capture.Stats{Entries: 3, Writes: 1, Bytes: switchBytes + 1, Size: switchBytes + 1}, false, true},
		{"paused, a large upper", capture.Stats{Entries: 2000, Writes: 1, Bytes: 10, Size: switchDiffBytes + 1}, true, true},
		{"running, a large upper", capture.Stats{Entries: 2000, Writes: 1, Bytes: 10, Size: switchDiffBytes + 1}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := switchRule(tc.st, tc.paused)
			if errors.Is(err, errSwitch) != tc.switches || (err != nil && !errors.Is(err, errSwitch)) {
				t.Fatalf("switchRule(%+v, paused %t) = %v, want a switch: %t", tc.st, tc.paused, err, tc.switches)
			}
		})
	}
}
