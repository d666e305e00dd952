package shim

import (
	"syscall"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/log"
)

// collect waits for a started process (libcontainer's Process.Wait: the shim is the process's
// parent or, for init and execs whose intermediate parents exit, its subreaper) and publishes
// its exit.
func (s *service) collect(c *container, p *process) {
	p.mu.Lock()
	lp, pid := p.lp, p.pid
	p.mu.Unlock()
	st, err := lp.Wait()
	s.reaper.disown(pid)
	code := exitCode(st)
	if err != nil && st == nil {
		log.G(s.ctx).WithError(err).WithField("pid", pid).Error("wait for container process")
	}
	if p.handOver(code) {
		return
	}
	if p.init {
		s.initExited(c, p, pid, code)
		return
	}
	s.publishExit(c, p, pid, code)
	c.execExited()
}

// initExited publishes the init's exit last, after every exec's: without a private PID
// namespace the remaining processes are killed first, then the running execs are waited for.
func (s *service) initExited(c *container, p *process, pid, code int) {
	c.mu.Lock()
	c.initExited = true
	c.mu.Unlock()
	if c.sharedPid {
		if err := c.engine().Signal(syscall.SIGKILL, true); err != nil {
			log.G(s.ctx).WithError(err).WithField("id", c.id).Debug("kill init's leftovers")
		}
	}
	c.mu.Lock()
	for c.runningExecs > 0 {
		c.execsDone.Wait()
	}
	c.mu.Unlock()

	// A Start in progress publishes its TaskStart first.
	p.startMu.Lock()
	defer p.startMu.Unlock()
	s.publishExit(c, p, pid, code)
	_, at := p.exit()
	if err := writeExit(c.bundle, exitRecord{Pid: pid, Status: code, Timestamp: at}); err != nil {
		log.G(s.ctx).WithError(err).WithField("id", c.id).Warn("record exit status in bundle")
	}
}

func (s *service) publishExit(c *container, p *process, pid, code int) {
	p.setExited(code)
	_, at := p.exit()
	s.events.send(&eventstypes.TaskExit{
		ContainerID: c.id,
		ID:          p.id,
		Pid:         uint32(pid),
		ExitStatus:  uint32(code),
		ExitedAt:    protobuf.ToTimestamp(at),
	})
}

// execExited counts an exec out (exited, or failed to start).
func (c *container) execExited() {
	c.mu.Lock()
	c.runningExecs--
	c.execsDone.Broadcast()
	c.mu.Unlock()
}
