package shim

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/console"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer"
)

// A terminal process's pty master lives in the shim, outside any dump, so CRIU cannot restore the
// pair: it restores the process's side of the terminal on a new pty pair and hands the new
// master to the restoring runtime (libcontainer asks for this with orphan-pts-master and passes
// the master on to the process's console socket). runc-v2 restores with a console socket for
// the same reason. Without a console socket libcontainer fails the restore ("sendmsg: bad file
// descriptor") and CRIU, with no terminal of its own to fall back on, gives up ("Don't have tty
// to inherit session from").

// takeConsole receives the pty master a started or restored process sent over cs and copies it
// to and from the process's stdio. A restore listens whatever the client asked (restored): a
// process checkpointed on a terminal sends a master, which only a terminal restore can take.
func (s *service) takeConsole(ctx context.Context, p *process, pio *processIO, cs *consoleSocket, restored bool) error {
	master, err := cs.receive()
	switch {
	case errors.Is(err, errNoConsole) && restored:
		if p.stdio.Terminal {
			// Its processes had closed their terminal: there is nothing to show on it.
			log.G(ctx).WithField("id", p.id).Warn("the restored process has no terminal open")
		}
		return nil
	case err != nil:
		return err
	case !p.stdio.Terminal:
		master.Close()
		return fmt.Errorf("the checkpoint holds a process on a terminal: restore it with a terminal (nerdctl start -a -i, cio.WithTerminal): %w", errdefs.ErrFailedPrecondition)
	}
	m, err := pio.attachConsole(ctx, master)
	if err != nil {
		master.Close()
		return err
	}
	p.mu.Lock()
	p.console = m
	p.mu.Unlock()
	return nil
}

// consoleHandover carries a terminal process's console across a restore in place. The client's
// input is held back from the moment the checkpoint starts: what reaches the old pty once the
// process is frozen or dead would be echoed, then lost with it (CRIU dumps the queued input of a
// pty only when it dumps both ends). The restore sends the new master over a console socket, the
// copies move onto it with the window size the client had set, and the input flows again.
type consoleHandover struct {
	master *ptyMaster
	cs     *consoleSocket
	ws     *console.WinSize
}

// holdConsole holds back p's terminal input until the handover ends; nil when p has no console.
func holdConsole(p *process) *consoleHandover {
	p.mu.Lock()
	m := p.console
	p.mu.Unlock()
	if m == nil {
		return nil
	}
	m.holdInput()
	return &consoleHandover{master: m}
}

// attach gives lp, which restores the process in place, a console socket to send its new master.
func (h *consoleHandover) attach(lp *libcontainer.Process) error {
	if h == nil {
		return nil
	}
	cs, err := newConsoleSocket()
	if err != nil {
		return err
	}
	h.cs = cs
	lp.ConsoleSocket = cs.child
	// The old master still knows the size: only the process's side of it is gone.
	if ws, err := h.master.size(); err == nil {
		h.ws = &ws
	}
	return nil
}

// complete moves the console's copies onto the master the restored process sent, and lets the
// input flow to it.
func (h *consoleHandover) complete(ctx context.Context) error {
	if h == nil || h.cs == nil {
		return nil
	}
	master, err := h.cs.receive()
	if errors.Is(err, errNoConsole) {
		// No restored process has the terminal open: the copies stay on the old master, whose
		// reads end when the process exits.
		log.G(ctx).Warn("the process restored in place has no terminal open")
		return nil
	}
	if err != nil {
		return fmt.Errorf("console of the task restored in place: %w", err)
	}
	_, ec, err := epollMaster(master)
	if err != nil {
		master.Close()
		return fmt.Errorf("console of the task restored in place: %w", err)
	}
	if h.ws != nil {
		if err := ec.Resize(*h.ws); err != nil {
			log.G(ctx).WithError(err).Warn("keep the console's window size across the restore")
		}
	}
	h.master.swap(ec)
	h.master.releaseInput()
	return nil
}

// Close ends the handover: the input flows again, to the new master or, if the checkpoint failed
// before the restore, to the old one.
func (h *consoleHandover) Close() {
	if h == nil {
		return
	}
	h.master.releaseInput()
	if h.cs != nil {
		h.cs.Close()
	}
}
