package shim

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/runtime"
)

// Execs in the container's process tree (runtime/treeexec.go): every exec is started through an
// intermediate that leaves it a child of the container's PID 1, so that a checkpoint dumps it
// with the init and a restore brings it back. Its exit is read through a pidfd (watchTree). Its
// stdio pipes to the shim are held across an in-place checkpoint and handed back to CRIU for the
// restore (treeHold), like the init's: output goes on flowing to the same client, and the process
// keeps its exec id and its pid in the container. An exec with a terminal is the leader of a
// session of its own on its pty, whose master stays in the shim: the dump names the pty external
// and the restore gets a new one, onto which the console moves (exectty.go).
//
// The execs of a container without a PID namespace of its own (a pod's shared one, the host's)
// run as the shim's children, and a checkpoint is refused while one runs (captureExecs): an
// orphan there goes to the pod's or the host's reaper, never to the container's init. An
// annotation opts a container out: its execs all run as the shim's children. So does a container
// whose PID 1 turns out not to reap them (reapcheck.go), from then on.
const execTreeAnnotation = "cklite.io/exec-in-tree"

// execsInTree reports whether p starts in the container's process tree.
func (c *container) execsInTree(p *process) bool {
	return !c.sharedPid && c.spec.Annotations[execTreeAnnotation] != "false" && c.pid1Reaps()
}

// launchInTree starts an exec in the container's process tree with its stdio (never the
// shim's /dev/null: a restored process must get back a pipe, see nullPipes), or on a new pty of
// the container whose master the shim receives as for any process with a terminal.
func (s *service) launchInTree(ctx context.Context, c *container, p *process, lp *libcontainer.Process) error {
	uid, gid := int(c.opts.IoUid), int(c.opts.IoGid)
	pio, err := newProcessIO(ctx, c.id, p.stdio, uid, gid, s.reaper)
	if err != nil {
		return fmt.Errorf("create process stdio: %w", err)
	}
	if err := pio.nullPipes(ctx, uid, gid); err != nil {
		pio.Close()
		return err
	}
	pio.wire(lp)
	var cs *consoleSocket
	if p.stdio.Terminal {
		if cs, err = newConsoleSocket(); err != nil {
			pio.Close()
			return err
		}
		defer cs.Close()
		lp.ConsoleSocket = cs.child
	}
	tp, err := c.engine().ExecInTree(lp)
	if err != nil {
		pio.Close()
		return err
	}
	pio.started()
	p.setIO(pio)
	if cs != nil {
		if err := s.takeConsole(ctx, p, pio, cs, false); err != nil {
			// Nobody would see its terminal: it goes, as a process whose stdio failed does.
			_ = signalTree(tp, unix.SIGKILL)
			tp.PidFD.Close()
			p.mu.Lock()
			p.io = nil
			p.mu.Unlock()
			pio.Close()
			return err
		}
	}
	p.setTree(tp)
	return p.started(nil, tp.Pid, statusRunning)
}

func (p *process) setTree(tp *runtime.TreeProcess) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tree = tp
	p.pid = tp.Pid
}

func (p *process) treeProcess() *runtime.TreeProcess {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tree
}

// watchTree publishes the exit of an exec in the tree. An in-place checkpoint kills the process
// with the dump and restores it: that exit is handed over to the cycle (treeHold), which watches
// the restored process anew, or publishes the exit if it did not come back.
func (s *service) watchTree(c *container, p *process) {
	tp := p.treeProcess()
	code := exitCodeUnknown
	if err := runtime.WaitTreeExit(tp.PidFD); err != nil {
		log.G(s.ctx).WithError(err).WithField("exec", p.id).Error("wait for exec'd process")
	} else if ws, err := runtime.TreeExitStatus(tp.PidFD, tp.Pid); err != nil {
		log.G(s.ctx).WithError(err).WithField("exec", p.id).Error("exit status of exec'd process")
	} else {
		code = waitStatusCode(syscall.WaitStatus(ws))
	}
	if p.handOver(code) || p.treeProcess() != tp {
		return
	}
	c.reaping.exited(tp.Pid, tp.Start, time.Now()) // before the exit is published: seen by the next exec
	s.publishExit(c, p, tp.Pid, code)
	c.execExited()
	tp.PidFD.Close()
}

// signalTree signals an exec in the tree through its pidfd: its pid may be reused once it is
// reaped by the container's PID 1, the pidfd still names it.
func signalTree(tp *runtime.TreeProcess, sig unix.Signal) error {
	if err := unix.PidfdSendSignal(int(tp.PidFD.Fd()), sig, nil, 0); err != nil {
		if err == unix.ESRCH {
			return fmt.Errorf("process already finished: %w", errdefs.ErrNotFound)
		}
		return fmt.Errorf("signal %d: %w", tp.Pid, err)
	}
	return nil
}

// captureExecs refuses a dump while processes started with exec run outside the init's process
// tree (in a PID namespace not the container's own, or in a container that opted out): CRIU
// would leave them out and, with the init's PID namespace gone, kill them. Execs in the tree are
// dumped with the init; their stdio is recorded into dir (writeExecStdio), and the dump options
// that make their terminals external are returned.
func (c *container) captureExecs(dir string) ([]string, error) {
	if ids := c.execsOutsideTree(); len(ids) > 0 {
		why := fmt.Sprintf("in a PID namespace not the container's own, or %s=false", execTreeAnnotation)
		if c.reaping.gaveUp() {
			why = "the container's PID 1 does not reap exited execs (they stayed zombies), so its execs run as the shim's children: run it with an init that reaps (nerdctl run --init, tini) or a shell as PID 1, see docs/checkpoints.md; or " + why
		}
		return nil, fmt.Errorf("container %s has %d process(es) started with exec outside its process tree still running (%s: %s): CRIU dumps only the init's process tree; wait for them or kill them first: %w",
			c.id, len(ids), strings.Join(ids, ", "), why, errdefs.ErrFailedPrecondition)
	}
	recorded, err := writeExecStdio(c, dir)
	if err != nil {
		return nil, err
	}
	return execTtyOptions(recorded), nil
}

// execsOutsideTree are the ids of c's running execs that are the shim's children.
func (c *container) execsOutsideTree() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for id, p := range c.execs {
		if p.status() == statusRunning && p.treeProcess() == nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// treeHold carries the execs in the tree through an in-place checkpoint: their exits are handed
// over (beginHandover), their stdio pipes held and passed to CRIU for the restore, and after it
// each is found again by its pid in the container and watched anew.
type treeHold struct {
	execs   []*heldExec
	files   []*os.File // the pipes passed to CRIU
	options []string   // CRIU's inherit-fd lines for them
	release func()
}

type heldExec struct {
	p   *process
	tp  *runtime.TreeProcess
	tty *ttyHandover // its terminal, if it runs on one
}

// holdTreeExecs prepares the running execs of c's tree for a dump; pids are the container's,
// recorded what captureExecs recorded of their stdio.
func holdTreeExecs(c *container, pids []int, recorded []execPipe) (*treeHold, error) {
	h := &treeHold{release: func() {}}
	pipes := map[string]*os.File{}
	var err error
	for _, p := range c.treeExecs() {
		he := &heldExec{p: p, tp: p.treeProcess()}
		h.execs = append(h.execs, he)
		if err := h.holdPipes(he, pipes, pids); err != nil {
			h.Close()
			return nil, err
		}
		if he.tty, err = holdTty(p, &c.standIns); err != nil {
			h.Close()
			return nil, err
		}
		if he.tty != nil {
			pipes[he.tp.Tty] = he.tty.slave
		}
	}
	// A terminal the dump names external whose exec has exited since (a background job of its
	// shell holds it still) gets a stand-in.
	for _, r := range recorded {
		if r.Tty != "" && r.Of == "" && pipes[r.Tty] == nil {
			f, err := nullTty(&c.standIns)
			if err != nil {
				h.Close()
				return nil, err
			}
			pipes[r.Tty] = f
			h.files = append(h.files, f)
		}
	}
	aliasTtys(recorded, pipes)
	if h.options, h.release, err = runtime.InheritPipes(pipes); err != nil {
		h.Close()
		return nil, err
	}
	for _, he := range h.execs {
		he.p.beginHandover()
	}
	return h, nil
}

// holdPipes opens the exec's stdio pipes through the container's processes (pids).
func (h *treeHold) holdPipes(he *heldExec, pipes map[string]*os.File, pids []int) error {
	for fd, flag := range []int{os.O_RDONLY, os.O_WRONLY, os.O_WRONLY} {
		name := he.tp.Stdio[fd]
		if !strings.HasPrefix(name, "pipe:") || pipes[name] != nil {
			continue
		}
		f, err := runtime.OpenPipe(name, flag, pids)
		if err != nil {
			return fmt.Errorf("hold stdio %d (%s) of exec %s across the checkpoint: %w", fd, name, he.p.id, err)
		}
		if f != nil {
			pipes[name] = f
			h.files = append(h.files, f)
		}
	}
	return nil
}

// reattach finds each held exec among the restored processes and watches it again.
func (h *treeHold) reattach(ctx context.Context, s *service, c *container, pids []int) {
	for _, he := range h.execs {
		tp, err := runtime.FindTreeProcess(pids, he.tp.NSPid)
		if err != nil {
			log.G(ctx).WithError(err).WithField("exec", he.p.id).Warn("exec'd process not restored")
			continue
		}
		tp.Stdio, tp.Tty = he.tp.Stdio, he.tty.name() // its terminal is the new pty's
		he.p.setTree(tp)
		he.tty.complete(ctx)
		go s.watchTree(c, he.p)
	}
}

// settle ends the handover: an exec that did not come back has exited, with the status its
// exit was handed over with (the dump's kill), unless its watcher has yet to see that exit and
// publishes it itself.
func (h *treeHold) settle(s *service, c *container) {
	for _, he := range h.execs {
		code, exited := he.p.endHandover()
		if he.p.treeProcess() != he.tp {
			he.tp.PidFD.Close() // restored: watched through its new pidfd
			continue
		}
		if exited {
			s.publishExit(c, he.p, he.tp.Pid, code)
			c.execExited()
			he.tp.PidFD.Close()
		}
	}
}

// Close releases the held pipes and terminals and CRIU's copies of them.
func (h *treeHold) Close() {
	if h == nil {
		return
	}
	h.release()
	for _, f := range h.files {
		f.Close()
	}
	for _, he := range h.execs {
		he.tty.Close()
	}
}

// treeExecs are c's running execs in the tree.
func (c *container) treeExecs() []*process {
	c.mu.Lock()
	defer c.mu.Unlock()
	var procs []*process
	for _, p := range c.execs {
		if p.treeProcess() != nil && p.status() == statusRunning {
			procs = append(procs, p)
		}
	}
	return procs
}

// holdExecs prepares the execs of the tree for the cycle: a checkpoint restores the very
// processes it dumps, execs included, on their own stdio; a rollback kills them (their exits are
// published) and brings back the checkpoint's, as processes with no exec id, on stand-in stdio.
func (ip *inPlace) holdExecs() (*treeHold, error) {
	if ip.what != "checkpoint" {
		return nullExecStdio(ip.restore.ImagePath, &ip.c.standIns)
	}
	recorded, err := readExecStdio(ip.restore.ImagePath)
	if err != nil {
		return nil, err
	}
	pids, _ := ip.c.engine().Pids()
	return holdTreeExecs(ip.c, pids, recorded)
}
