package shim

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
)

func TestTransitions(t *testing.T) {
	for _, tc := range []struct {
		from, to status
		ok       bool
	}{
		{statusCreated, statusRunning, true},
		{statusCreated, statusRestoring, true},
		{statusCreated, statusPaused, false},
		{statusRunning, statusCheckpointing, true},
		{statusPaused, statusCheckpointing, true},
		{statusCreated, statusCheckpointing, false},
		{statusCheckpointing, statusRestoring, true},
		{statusCheckpointing, statusPaused, true},
		{statusRestoring, statusCheckpointing, false},
		{statusRunning, statusRestoring, true}, // a rollback
		{statusStopped, statusRunning, false},
		{statusStopped, statusPaused, false}, // a Pause never overwrites an exit
		{statusStopped, statusDeleted, true},
		{statusDeleted, statusStopped, false},
		{statusDeleted, statusDeleted, false}, // a second Delete
	} {
		p := newProcess("p", true, stdio{})
		p.state = tc.from
		_, err := p.transition("test", tc.to)
		if (err == nil) != tc.ok {
			t.Errorf("%s → %s: %v, want allowed %v", tc.from, tc.to, err, tc.ok)
		}
		// A deleted process is gone (NotFound, as runc's shim says); any other refusal is
		// FailedPrecondition.
		if wantErr := map[bool]func(error) bool{true: errdefs.IsNotFound, false: errdefs.IsFailedPrecondition}[tc.from == statusDeleted]; err != nil && !wantErr(err) {
			t.Errorf("%s → %s: %v, want NotFound for a deleted process, else FailedPrecondition", tc.from, tc.to, err)
		}
		if want := map[bool]status{true: tc.to, false: tc.from}[tc.ok]; p.status() != want {
			t.Errorf("%s → %s: process %s, want %s", tc.from, tc.to, p.status(), want)
		}
	}
}

// call is a task API call made while a checkpoint or rollback holds the container.
type call struct {
	name string
	do   func(context.Context, *service) error
}

var callsDuringCycle = []call{
	{"Kill", func(ctx context.Context, s *service) error {
		_, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "c", Signal: 15})
		return err
	}},
	{"Pause", func(ctx context.Context, s *service) error {
		_, err := s.Pause(ctx, &taskAPI.PauseRequest{ID: "c"})
		return err
	}},
	{"Exec", func(ctx context.Context, s *service) error {
		spec, err := typeurl.MarshalAnyToProto(&specs.Process{Args: []string{"true"}, Cwd: "/"})
		if err != nil {
			return err
		}
		_, err = s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "c", ExecID: "e", Spec: spec})
		return err
	}},
	{"Update", func(ctx context.Context, s *service) error {
		res, err := typeurl.MarshalAnyToProto(&specs.LinuxResources{})
		if err != nil {
			return err
		}
		_, err = s.Update(ctx, &taskAPI.UpdateTaskRequest{ID: "c", Resources: res})
		return err
	}},
	{"Delete", func(ctx context.Context, s *service) error {
		_, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "c"})
		return err
	}},
}

// queued waits until the call is queued behind the container's lifecycle lock, and fails the
// test if it returns instead, while the cycle still holds the container.
func queued(t *testing.T, c *container, name string, done <-chan error) {
	t.Helper()
	for c.lifecycle.waiting.Load() == 0 {
		select {
		case err := <-done:
			t.Fatalf("%s returned (%v) in the middle of the cycle instead of waiting for it", name, err)
		default:
			runtime.Gosched()
		}
	}
}

// A call that arrives during a memory checkpoint waits for it, then acts on the task the
// checkpoint leaves running; a failed dump leaves the task as it was.
func TestCallsDuringCheckpoint(t *testing.T) {
	want := map[string]func(error) bool{
		"Kill": isNil, "Pause": isNil, "Exec": isNil, "Update": isNil,
		"Delete": errdefs.IsFailedPrecondition, // the task runs on
	}
	for _, dumpFails := range []bool{false, true} {
		for _, cl := range callsDuringCycle {
			t.Run(cl.name+map[bool]string{true: " after a failed dump"}[dumpFails], func(t *testing.T) {
				e := newFakeEngine(t, "engine")
				e.block["Checkpoint"] = true
				if dumpFails {
					e.fail["Checkpoint"] = errdefs.ErrUnknown
				}
				s, c := fakeService(t, e, map[string]string{checkpoint.ContentsKey: string(checkpoint.MemoryOnly)})
				ctx := namespaces.WithNamespace(context.Background(), "test")
				dir := t.TempDir()
				ckDone := make(chan error, 1)
				go func() {
					_, err := s.Checkpoint(ctx, &taskAPI.CheckpointTaskRequest{ID: "c", Path: dir})
					ckDone <- err
				}()
				select {
				case <-e.entered:
				case err := <-ckDone:
					t.Fatalf("Checkpoint ended before its dump: %v", err)
				}
				if st := c.init.status(); st != statusCheckpointing {
					t.Fatalf("during the dump the init is %s, want checkpointing", st)
				}
				callDone := make(chan error, 1)
				go func() { callDone <- cl.do(ctx, s) }()
				queued(t, c, cl.name, callDone)
				close(e.release)
				if err := <-ckDone; (err != nil) != dumpFails {
					t.Fatalf("Checkpoint: %v", err)
				}
				if err := errgrpc.ToNative(<-callDone); !want[cl.name](err) {
					t.Fatalf("%s after the checkpoint: %v", cl.name, err)
				}
				if st := c.init.status(); st != statusRunning && st != statusPaused {
					t.Fatalf("after the checkpoint the init is %s, want it running", st)
				}
				// What the call did to the engine, it did after the dump (the fake fails the
				// test for a call during it).
				if call, ok := engineCall[cl.name]; ok {
					calls := e.called()
					if i := slices.Index(calls, "Checkpoint"); i < 0 || !slices.Contains(calls[i:], call) {
						t.Fatalf("engine calls %v: want %s after Checkpoint", calls, call)
					}
				}
			})
		}
	}
}

// A call that arrives during a rollback waits for it; a rollback whose restore fails leaves the
// task stopped (its exit published) and the checkpoint where it was, and the queued call then
// sees the stopped task.
func TestCallsDuringFailedRollback(t *testing.T) {
	want := map[string]func(error) bool{
		"Kill":   errdefs.IsNotFound, // already finished
		"Pause":  errdefs.IsFailedPrecondition,
		"Exec":   errdefs.IsFailedPrecondition,
		"Update": errdefs.IsFailedPrecondition,
		"Delete": isNil,
	}
	for _, cl := range callsDuringCycle {
		t.Run(cl.name, func(t *testing.T) {
			e := newFakeEngine(t, "engine")
			e.block["Kill"] = true
			s, c := fakeService(t, e, nil)
			ctx := namespaces.WithNamespace(context.Background(), "test")
			dir := memoryCheckpoint(t)
			rbDone := make(chan error, 1)
			go func() { rbDone <- s.rollbackInPlace(ctx, c, dir, false) }()
			select {
			case <-e.entered:
			case err := <-rbDone:
				t.Fatalf("rollback ended before its kill: %v", err)
			}
			if st := c.init.status(); st != statusRestoring {
				t.Fatalf("during the rollback the init is %s, want restoring", st)
			}
			callDone := make(chan error, 1)
			go func() { callDone <- cl.do(ctx, s) }()
			queued(t, c, cl.name, callDone)
			close(e.release)
			// The fake restore starts no process: the restore fails.
			if err := <-rbDone; err == nil {
				t.Fatal("rollback succeeded with a restore that started nothing")
			}
			if err := errgrpc.ToNative(<-callDone); !want[cl.name](err) {
				t.Fatalf("%s after the failed rollback: %v", cl.name, err)
			}
			if st := c.init.status(); st != statusStopped && st != statusDeleted {
				t.Fatalf("after the failed rollback the init is %s, want stopped", st)
			}
			if code, _ := c.init.exit(); code != 137 {
				t.Fatalf("exit status %d, want the kill's 137", code)
			}
			if _, err := checkpoint.Read(dir); err != nil {
				t.Fatalf("the checkpoint is gone after a failed rollback: %v", err)
			}
		})
	}
}

// memoryCheckpoint is an image directory a memory-only rollback accepts.
func memoryCheckpoint(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "inventory.img"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	meta := checkpoint.Meta{ID: "ck", Container: "c", Contents: checkpoint.MemoryOnly, Version: ckliteVersion}
	if err := checkpoint.Write(dir, meta); err != nil {
		t.Fatal(err)
	}
	return dir
}

func isNil(err error) bool { return err == nil }

// engineCall is the engine call a task API call makes on a running task.
var engineCall = map[string]string{"Kill": "Signal 15", "Pause": "Pause", "Update": "Update"}

// State of an init that Start is restoring answers created at once: containerd fails a State
// that takes 2 s, and nerdctl's logging binary, started by the restore, stops logging when its
// first State fails. During a checkpoint or rollback it waits (TestCallsDuringCheckpoint).
func TestStateDuringRestoreAtStart(t *testing.T) {
	e := newFakeEngine(t, "engine")
	e.block["Restore"] = true
	s, c := fakeService(t, e, nil)
	c.init = newProcess("c", true, stdio{})
	c.init.spec = &specs.Process{Args: []string{"sleep", "1000"}, Cwd: "/"}
	c.checkpoint, c.opts = memoryCheckpoint(t), &options.Options{}
	ctx := namespaces.WithNamespace(context.Background(), "test")
	startDone := make(chan error, 1)
	go func() {
		_, err := s.Start(ctx, &taskAPI.StartRequest{ID: "c"})
		startDone <- err
	}()
	select {
	case <-e.entered:
	case err := <-startDone:
		t.Fatalf("Start ended before its restore: %v", err)
	}
	stateDone := make(chan error, 1)
	var st *taskAPI.StateResponse
	go func() {
		var err error
		st, err = s.State(ctx, &taskAPI.StateRequest{ID: "c"})
		stateDone <- err
	}()
	for {
		if c.lifecycle.waiting.Load() > 0 {
			close(e.release)
			<-startDone
			t.Fatal("State waits for the restore at Start")
		}
		select {
		case err := <-stateDone:
			if err != nil || st.Status != task.Status_CREATED {
				t.Fatalf("State during the restore at Start: %v, %v; want created", st, err)
			}
			close(e.release)
			// The fake restore starts no process: Start fails, and the task is created again.
			if err := <-startDone; err == nil {
				t.Fatal("Start succeeded with a restore that started nothing")
			}
			if c.startRestoring.Load() {
				t.Fatal("the restore at Start is over, and State still would not wait")
			}
			return
		default:
			runtime.Gosched()
		}
	}
}
