package runtime

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	goruntime "runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/criuwrap"
)

// A dump through libcontainer starts CRIU for itself: the wrapper's fork and exec
// (pkg/criuwrap), then CRIU's exec, its 23 shared libraries and its start, all inside the
// checkpoint's time (~5 ms for `criu --version` here against 1.3 ms for /bin/true, more under
// load). CRIU's service mode (`criu swrk`) does nothing before its request arrives: it reads the
// kerndat cache, its configuration file and the image and work directories only then, the
// directories through /proc/<client pid>/fd/N of descriptors the client holds at the request
// (cr-service.c). So a `criu swrk` started ahead of time, after a container's previous dump,
// serves the next one as well as one started for it: the dump driver (dumpdriver.go) only sends
// the request and reads the answer. One request per CRIU: swrk takes no second dump on the same
// socket (chk_keepopen_req), so each dump starts the next one in the background.
//
// A CRIU started ahead is the shim's child for as long as the container may be checkpointed
// again, outside any call the shim's reaper of orphans holds off for (the reaper reaps every
// exited child nobody owns): it is owned from its start to its wait (CRIUChildren). Its
// parent-death signal (the wrapper's, pkg/criuwrap) is tied to the thread that forked it, which
// Go may end once a goroutine locked to it exits: the goroutine that starts it keeps its thread
// locked until CRIU is waited for. It is ended when its container goes (Destroy, Vacate) and with
// the shim (the signal); a restore in place hands it to the engine that replaces the container's
// (KeepReadyCRIU before Vacate, AdoptReadyCRIU after). An idle `criu swrk` holds 6 MB resident,
// 0.9 MB of it its own (the rest its shared libraries' pages), and the shim a thread
// (docs/performance.md).

// CRIUChildren keeps the shim's reaper of orphans off the CRIU processes the runtime starts
// ahead of a dump and waits for itself: Hold suspends reaping (until release), Own and Disown
// mark a pid as waited for by the runtime and hand it back.
type CRIUChildren struct {
	Hold   func() (release func())
	Own    func(pid int)
	Disown func(pid int)
}

// criuKeeper is what KeepCRIUChildren set; a process without a reaper has nothing to keep off.
var criuKeeper = CRIUChildren{
	Hold:   func() func() { return func() {} },
	Own:    func(int) {},
	Disown: func(int) {},
}

// KeepCRIUChildren tells the runtime how to keep the shim's reaper off the CRIU processes it
// starts ahead of dumps. Called once, at the shim's start, before any container exists.
func KeepCRIUChildren(k CRIUChildren) { criuKeeper = k }

// swrk is one `criu swrk` waiting for its request on conn.
type swrk struct {
	conn   *net.UnixConn
	pid    int
	exited chan struct{} // closed once CRIU has been waited for; state is then set
	state  *os.ProcessState
}

// startSwrk starts `criu swrk` (the wrapper, as libcontainer does) on one end of a socket pair.
func startSwrk() (*swrk, error) {
	fds, err := unix.Socketpair(unix.AF_LOCAL, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("CRIU socket: %w", err)
	}
	client := os.NewFile(uintptr(fds[0]), "criu-client")
	server := os.NewFile(uintptr(fds[1]), "criu-server")
	defer server.Close()
	conn, err := net.FileConn(client)
	client.Close()
	if err != nil {
		return nil, fmt.Errorf("CRIU socket: %w", err)
	}
	cmd := exec.Command(criuwrap.Name, "swrk", "3")
	cmd.ExtraFiles = []*os.File{server}
	// CRIU changes to the request's work directory; until then it pins none of the shim's.
	cmd.Dir = "/"
	s := &swrk{conn: conn.(*net.UnixConn), exited: make(chan struct{})}
	started := make(chan error, 1)
	go s.run(cmd, started)
	if err := <-started; err != nil {
		s.conn.Close()
		return nil, fmt.Errorf("start CRIU: %w", err)
	}
	return s, nil
}

// run starts cmd, says how on started, and waits for it, on a locked thread (the parent-death
// signal's) and owned against the reaper.
func (s *swrk) run(cmd *exec.Cmd, started chan<- error) {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	keep := criuKeeper
	release := keep.Hold()
	err := cmd.Start()
	if err == nil {
		s.pid = cmd.Process.Pid
		keep.Own(s.pid)
	}
	release()
	started <- err
	if err != nil {
		return
	}
	s.state, _ = cmd.Process.Wait()
	keep.Disown(s.pid)
	close(s.exited)
}

// alive reports whether CRIU is still there to take a request.
func (s *swrk) alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// end kills CRIU and waits for it: a CRIU that never got its request has nothing to finish.
func (s *swrk) end() {
	s.conn.Close()
	if s.alive() {
		_ = unix.Kill(s.pid, unix.SIGKILL) // our unwaited child: the pid cannot be another's
	}
	<-s.exited
}

// exitError is how CRIU ended, once it has: nil for a clean exit.
func (s *swrk) exitError() error {
	<-s.exited
	if s.state == nil || s.state.Success() {
		return nil
	}
	return fmt.Errorf("criu failed: %s", s.state)
}

// PrepareNextDump starts, in the background, a CRIU ahead of the container's next dump when the
// dump driver would take that dump (declineContainer). The shim calls it once a leave-running
// checkpoint or a rollback in place has been answered: a container checkpointed or rolled back is
// one a client checkpoints again, and a fork and exec started earlier (at the thaw) took the CPU
// from the checkpoint's commit on two cores (5 ms more, every run).
func (c *Container) PrepareNextDump() {
	if c.declineContainer() == "" {
		c.ready.prepare()
	}
}

// readyCRIU is a container's CRIU started ahead of its next dump: at most one, none before its
// first checkpoint or rollback, none once the container is gone.
type readyCRIU struct {
	mu    sync.Mutex
	next  *pendingSwrk
	ended bool
}

// pendingSwrk is a CRIU being started in the background.
type pendingSwrk struct {
	done chan struct{}
	s    *swrk
	err  error
}

// end waits for the CRIU's start, then ends it if it started.
func (p *pendingSwrk) end() {
	<-p.done
	if p.s != nil {
		p.s.end()
	}
}

// prepare starts the next CRIU in the background, unless one is there or the container is gone.
func (r *readyCRIU) prepare() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.prepareLocked()
}

func (r *readyCRIU) prepareLocked() {
	if r.ended || r.next != nil {
		return
	}
	p := &pendingSwrk{done: make(chan struct{})}
	r.next = p
	go func() {
		p.s, p.err = startSwrk()
		close(p.done)
	}()
}

// take hands over the CRIU started ahead, waiting for its start if it is under way, or starts
// one now (the first dump, one whose CRIU died meanwhile).
func (r *readyCRIU) take() (*swrk, error) {
	r.mu.Lock()
	p, ended := r.next, r.ended
	r.next = nil
	r.mu.Unlock()
	if ended {
		return nil, errors.New("the container is gone: no CRIU for its dump")
	}
	if p != nil {
		<-p.done
		if p.err == nil && p.s.alive() {
			return p.s, nil
		}
		p.end()
	}
	return startSwrk()
}

// ReadyCRIU is a CRIU started ahead of a dump, between the engine a restore in place replaces
// and the one it makes (KeepReadyCRIU, AdoptReadyCRIU). A CRIU waiting for its first request
// knows nothing of a container: the next engine's dump is served by it as well.
type ReadyCRIU struct {
	p *pendingSwrk
}

// KeepReadyCRIU takes the CRIU the container started ahead of its next dump, if any, out of the
// container, so that Vacate or Destroy leaves it running: a restore in place hands it to the engine
// it makes (AdoptReadyCRIU) instead of ending it with the old one and starting another once
// answered (the kill and wait of one CRIU on the rollback's path, the fork and exec of the next
// beside the client's next steps). The caller ends it (End) if no engine adopts it.
func (c *Container) KeepReadyCRIU() *ReadyCRIU {
	r := &c.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.next
	r.next = nil
	if p == nil {
		return nil
	}
	return &ReadyCRIU{p: p}
}

// AdoptReadyCRIU makes kept the CRIU of the container's next dump. A container that has one
// already, or is gone, ends kept. kept may be nil.
func (c *Container) AdoptReadyCRIU(kept *ReadyCRIU) {
	if kept == nil {
		return
	}
	r := &c.ready
	r.mu.Lock()
	if !r.ended && r.next == nil {
		r.next, kept = kept.p, nil
	}
	r.mu.Unlock()
	kept.End()
}

// End ends a kept CRIU no engine adopted. kept may be nil.
func (kept *ReadyCRIU) End() {
	if kept == nil {
		return
	}
	kept.p.end()
}

// end ends the CRIU started ahead, if any, and every later prepare.
func (r *readyCRIU) end() {
	r.mu.Lock()
	p := r.next
	r.next, r.ended = nil, true
	r.mu.Unlock()
	if p == nil {
		return
	}
	p.end()
}
