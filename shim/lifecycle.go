package shim

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
)

// status is a process's place in its lifecycle. An exec goes created → running → stopped →
// deleted; the init may also be paused, and passes through checkpointing and restoring while the
// shim dumps it or brings it back (see transitions).
type status int

const (
	statusCreated status = iota
	statusRunning
	statusPaused
	statusCheckpointing // a CRIU dump (and, leaving the task running, the in-place cycle after it)
	statusRestoring     // CRIU restores the init: at Start from a checkpoint, or in place
	statusStopped
	statusDeleted
)

func (s status) String() string {
	return [...]string{"created", "running", "paused", "checkpointing", "restoring", "stopped", "deleted"}[s]
}

// task is the status containerd sees. A task being checkpointed or restored is running as far as
// containerd knows (calls that could see otherwise wait for the cycle to end, see doc.go).
func (s status) task() task.Status {
	return [...]task.Status{task.Status_CREATED, task.Status_RUNNING, task.Status_PAUSED,
		task.Status_RUNNING, task.Status_RUNNING, task.Status_STOPPED, task.Status_STOPPED}[s]
}

// transitions is the lifecycle, the one place that says which state may follow which:
//
//	from           to
//	created        running (Start), restoring (Start from a checkpoint), stopped, deleted
//	running        paused, checkpointing, restoring (rollback), stopped
//	paused         running, checkpointing, restoring (rollback), stopped
//	checkpointing  running or paused (the dump failed, or a filesystem-only checkpoint ended),
//	               restoring (in place after the dump), stopped (exit, or the restore failed)
//	restoring      running, paused (a paused task comes back paused), created (a restore at
//	               Start failed: nothing runs), stopped (the restore failed)
//	stopped        deleted
//
// Every process exit is a transition to stopped, from wherever the process was.
var transitions = map[status][]status{
	statusCreated:       {statusRunning, statusRestoring, statusStopped, statusDeleted},
	statusRunning:       {statusPaused, statusCheckpointing, statusRestoring, statusStopped},
	statusPaused:        {statusRunning, statusCheckpointing, statusRestoring, statusStopped},
	statusCheckpointing: {statusRunning, statusPaused, statusRestoring, statusStopped},
	statusRestoring:     {statusRunning, statusPaused, statusCreated, statusStopped},
	statusStopped:       {statusDeleted},
}

// canGo reports whether the lifecycle allows from → to.
func canGo(from, to status) bool {
	return slices.Contains(transitions[from], to)
}

// transition moves the process to state to, if the lifecycle allows it from where the process is
// now: the check and the change are one step under p.mu, so an exit collected meanwhile is never
// overwritten. It returns the state the process left; op names the call in the error.
func (p *process) transition(op string, to status) (status, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.transitionLocked(op, to)
}

func (p *process) transitionLocked(op string, to status) (status, error) {
	from := p.state
	if from == to && to == statusRestoring {
		return from, nil // a rollback restores from its start
	}
	if !canGo(from, to) {
		return from, refusal(op, from)
	}
	p.state = to
	return from, nil
}

// expect fails with FailedPrecondition unless the process is in one of the given states: the
// guard of a call that changes no state (exec in, update). Callers acting on the engine hold the
// container's lifecycle lock, so no other call changes the state between the check and the act;
// only an exit can, and then the engine's own error says so.
func (p *process) expect(op string, ok ...status) error {
	if st := p.status(); !slices.Contains(ok, st) {
		return refusal(op, st)
	}
	return nil
}

// refusal is the error of op refused to a process in state st: FailedPrecondition, or NotFound
// for a deleted process, which is gone (as runc's shim answers), so that a second Delete (CRI and
// a client racing to remove the same task) counts as done.
func refusal(op string, st status) error {
	if st == statusDeleted {
		return fmt.Errorf("cannot %s a %s process: %w", op, st, errdefs.ErrNotFound)
	}
	return fmt.Errorf("cannot %s a %s process: %w", op, st, errdefs.ErrFailedPrecondition)
}

// settle ends a checkpoint or rollback that left the process in state mid (neither an exit nor
// a restore moved it on): it is back where it was, in from.
func (p *process) settle(mid, from status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == mid {
		_, _ = p.transitionLocked("end", from)
	}
}

// lifecycleLock is a container's lifecycle lock (see doc.go): a mutex that counts the calls
// queued behind its holder, which is what a test waits for to know a call is queued.
type lifecycleLock struct {
	mu      sync.Mutex
	waiting atomic.Int32
}

func (l *lifecycleLock) Lock() {
	l.waiting.Add(1)
	l.mu.Lock()
	l.waiting.Add(-1)
}

func (l *lifecycleLock) Unlock() { l.mu.Unlock() }
