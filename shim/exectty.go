package shim

import (
	"context"
	"io"
	"os"
	"sort"
	"sync"

	"github.com/containerd/console"
	"github.com/containerd/log"

	"github.com/cklite/cklite/runtime"
)

// Terminals of the execs in the tree (runtime/exttty.go). A dump names each running exec's pty
// external (execTtyOptions); the restore gives CRIU a slave of a new pty pair the shim makes.
// After a checkpoint in place, the exec is the same and keeps its client: its console's copies
// move onto the new master (ttyHandover), as the init's do (tty_restore.go). After a rollback or
// a fork, the restored process has no exec id and no client: the new master's output is read and
// discarded, and no input comes (nullTty).

// execTtyOptions are the dump options that make the terminals recorded of the running execs
// (writeExecStdio), and the /dev/tty standing for one of them, external.
func execTtyOptions(recorded []execPipe) []string {
	var opts []string
	for _, p := range recorded {
		if p.Tty != "" {
			opts = append(opts, runtime.ExternalTty(p.Tty))
		}
	}
	return opts
}

// aliasTtys gives /dev/tty, where recorded says it stands for an exec's terminal, the file that
// terminal gets at the restore.
func aliasTtys(recorded []execPipe, files map[string]*os.File) {
	for _, p := range recorded {
		if p.Of != "" && files[p.Of] != nil {
			files[p.Tty] = files[p.Of]
		}
	}
}

// nullTty is the slave of a new pty whose output is read and discarded until no process holds
// the slave any more (the master then reads EIO), and which gets no input: a restored shell
// waits at its prompt, with its memory, rather than reading the end of its input and exiting.
// It is one of the container's stand-ins while the master is read (by a blocking read, one
// thread a stand-in: the master is no Go-polled file, see runtime.NewTty).
func nullTty(standIns *ttyStandIns) (*os.File, error) {
	master, slave, err := runtime.NewTty()
	if err != nil {
		return nil, err
	}
	name := runtime.TtyName(slave)
	standIns.add(name)
	go func() {
		_, _ = io.Copy(io.Discard, master)
		master.Close()
		standIns.remove(name)
	}()
	return slave, nil
}

// ttyStandIns are the terminals a container's restores gave its processes that have no exec id
// (nullTty), by CRIU's name: their master is the shim's, so a later dump names them external
// too, and records them (writeExecStdio) for a restore of that dump to get stand-ins again.
type ttyStandIns struct {
	mu    sync.Mutex
	names map[string]int // name -> stand-ins of that name alive (a pty's number is reused)
}

func (t *ttyStandIns) add(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.names == nil {
		t.names = map[string]int{}
	}
	t.names[name]++
}

func (t *ttyStandIns) remove(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.names[name]--; t.names[name] <= 0 {
		delete(t.names, name)
	}
}

// list returns the names of the stand-ins alive, sorted.
func (t *ttyStandIns) list() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	names := make([]string, 0, len(t.names))
	for name := range t.names {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// ttyHandover carries the console of an exec in the tree across a checkpoint in place: its input
// is held back from before the dump, the restore gets the slave of a new pty pair, and once the
// exec is found restored its console's copies move onto the new master, sized as the old one.
type ttyHandover struct {
	console *ptyMaster
	next    console.Console
	slave   *os.File // for CRIU; the shim's copy closes with the hold
	ws      *console.WinSize
}

// holdTty prepares p's terminal for the dump; nil when p has none. With no console to carry
// over (nobody reads it), the restore gets a stand-in.
func holdTty(p *process, standIns *ttyStandIns) (*ttyHandover, error) {
	if p.treeProcess().Tty == "" {
		return nil, nil
	}
	p.mu.Lock()
	m := p.console
	p.mu.Unlock()
	if m == nil {
		slave, err := nullTty(standIns)
		if err != nil {
			return nil, err
		}
		return &ttyHandover{slave: slave}, nil
	}
	next, slave, err := runtime.NewTty()
	if err != nil {
		return nil, err
	}
	m.holdInput()
	h := &ttyHandover{console: m, next: next, slave: slave}
	if ws, err := m.size(); err == nil {
		h.ws = &ws
	}
	return h, nil
}

// complete moves the console onto the new master: the exec was restored on its slave.
func (h *ttyHandover) complete(ctx context.Context) {
	if h == nil || h.console == nil {
		return
	}
	next := h.next
	h.next = nil
	_, ec, err := epollMaster(next)
	if err != nil {
		log.G(ctx).WithError(err).Error("console of the exec restored in place")
		next.Close()
		return
	}
	if h.ws != nil {
		if err := ec.Resize(*h.ws); err != nil {
			log.G(ctx).WithError(err).Warn("keep the exec's window size across the restore")
		}
	}
	h.console.swap(ec)
	h.console.releaseInput()
	h.console = nil
}

// Close ends the handover: a console not moved keeps its old master (the exec did not come
// back), its input flowing again.
func (h *ttyHandover) Close() {
	if h == nil {
		return
	}
	if h.console != nil {
		h.console.releaseInput()
	}
	if h.next != nil {
		h.next.Close()
	}
	h.slave.Close()
}

// name is CRIU's name of the terminal the exec gets at the restore; "" without one.
func (h *ttyHandover) name() string {
	if h == nil {
		return ""
	}
	return runtime.TtyName(h.slave)
}
