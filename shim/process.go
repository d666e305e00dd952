package shim

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/console"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runc/libcontainer"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/runtime"
)

// process is a container's init or one of its execs.
type process struct {
	id    string // the exec id, or the container id for init
	init  bool
	stdio stdio
	spec  *specs.Process // exec only: what Start will run

	// startMu orders a start's event before the exit of the process it started.
	startMu sync.Mutex

	mu         sync.Mutex
	state      status
	pid        int
	lp         *libcontainer.Process
	io         *processIO
	stdinShut  bool // CloseIO came, maybe before the stdio existed
	console    *ptyMaster
	exitStatus int
	exitedAt   time.Time
	waitBlock  chan struct{}
	// handover, while a checkpoint restores the process in place, receives its exit instead of
	// Wait and containerd: the process is killed by the dump and comes back restored.
	handover chan int
	// tree is an exec started in the container's process tree (treeexec.go); nil otherwise.
	tree *runtime.TreeProcess
}

func newProcess(id string, init bool, s stdio) *process {
	return &process{id: id, init: init, stdio: s, waitBlock: make(chan struct{})}
}

func (p *process) status() status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// started records a process libcontainer has started, created (init waiting on the exec
// fifo) or running, restored or not: in state st, which the lifecycle must allow.
func (p *process) started(lp *libcontainer.Process, pid int, st status) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lp, p.pid = lp, pid
	if p.state == st {
		return nil
	}
	_, err := p.transitionLocked("start", st)
	return err
}

func (p *process) getPid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// beginHandover diverts the process's next exit to the returned channel.
func (p *process) beginHandover() <-chan int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.handover = make(chan int, 1)
	return p.handover
}

// endHandover stops diverting exits and returns an exit that was diverted meanwhile, if any.
func (p *process) endHandover() (code int, exited bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case code = <-p.handover:
		exited = true
	default:
	}
	p.handover = nil
	return code, exited
}

// handOver passes an exit to a checkpoint in progress; false when none is.
func (p *process) handOver(code int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.handover == nil {
		return false
	}
	p.handover <- code
	return true
}

// setExited records the exit and wakes every Wait.
func (p *process) setExited(code int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.transitionLocked("exit", statusStopped); err != nil {
		return // stopped or deleted already
	}
	p.exitStatus = code
	p.exitedAt = time.Now()
	if p.console != nil {
		p.console.shutdown() // pending console reads return
	}
	close(p.waitBlock)
}

func (p *process) exit() (int, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitStatus, p.exitedAt
}

func (p *process) wait(ctx context.Context) error {
	select {
	case <-p.waitBlock:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// signal signals an exec process (init goes through the engine).
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.state {
	case statusCreated:
		return fmt.Errorf("process not created: %w", errdefs.ErrFailedPrecondition)
	case statusStopped, statusDeleted:
		return fmt.Errorf("process already finished: %w", errdefs.ErrNotFound)
	}
	if p.tree != nil {
		return signalTree(p.tree, sig)
	}
	if err := unix.Kill(p.pid, sig); err != nil {
		if err == unix.ESRCH {
			return fmt.Errorf("process already finished: %w", errdefs.ErrNotFound)
		}
		return fmt.Errorf("signal %d: %w", p.pid, err)
	}
	return nil
}

// holdInput holds back the input of the process's terminal, if it has one, until releaseInput.
func (p *process) holdInput() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.console != nil {
		p.console.holdInput()
	}
}

func (p *process) releaseInput() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.console != nil {
		p.console.releaseInput()
	}
}

func (p *process) resize(ws console.WinSize) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == statusStopped || p.state == statusDeleted {
		return fmt.Errorf("cannot resize a %s process: %w", p.state, errdefs.ErrFailedPrecondition)
	}
	if p.console == nil {
		return nil
	}
	return p.console.resize(ws)
}

// closeStdin implements CloseIO. The client may send it as soon as it has written all of stdin,
// which can be while Start is still wiring the stdio: setIO then closes stdin.
func (p *process) closeStdin() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stdinShut = true
	if p.io == nil {
		return nil
	}
	return p.io.closeStdin()
}

// setIO records the process's stdio, honouring an earlier CloseIO.
func (p *process) setIO(pio *processIO) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.io = pio
	if p.stdinShut {
		_ = pio.closeStdin()
	}
}

// release drains and closes the process's stdio and console (Delete).
func (p *process) release(drain time.Duration) error {
	p.mu.Lock()
	pio, con := p.io, p.console
	p.io, p.console = nil, nil
	p.mu.Unlock()
	var err error
	if pio != nil {
		err = pio.drain(drain)
		pio.Close()
	}
	if con != nil {
		con.Close()
	}
	return err
}
