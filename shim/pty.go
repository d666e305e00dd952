package shim

import (
	"sync"

	"github.com/containerd/console"
)

// ptyMaster is a process's pty master as the shim's console copies, resizes and hang-ups see it.
// A checkpoint restores a terminal process in place on a new pty pair (CRIU cannot reopen the old
// one: its master is the shim's, outside the dump) and hands over the new master; swap moves
// the copies onto it without ending them, so the client's stream goes on through the same FIFOs.
type ptyMaster struct {
	ep *console.Epoller

	mu     sync.Mutex
	ec     *console.EpollConsole
	hungUp bool          // shutdown was called: a master swapped in later is hung up too
	holds  int           // holdInput calls not released yet
	held   chan struct{} // while holds > 0: closed when the input may flow again
}

func newPtyMaster(ep *console.Epoller, ec *console.EpollConsole) *ptyMaster {
	return &ptyMaster{ep: ep, ec: ec}
}

func (m *ptyMaster) current() *console.EpollConsole {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ec
}

// retired reports whether swap has replaced ec.
func (m *ptyMaster) retired(ec *console.EpollConsole) bool {
	return m.current() != ec
}

// Read reads the process's terminal output. Once the process's side of the pty is closed (the
// dump killed the process) a read waits, and a read that swap cuts short carries on from the new
// master: the copy to the client sees neither an error nor EOF.
func (m *ptyMaster) Read(b []byte) (int, error) {
	for {
		ec := m.current()
		n, err := ec.Read(b)
		if err != nil && m.retired(ec) {
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

// Write writes the client's input to the process's terminal, once it is no longer held back;
// what a swap interrupts goes to the new master.
func (m *ptyMaster) Write(b []byte) (int, error) {
	var done int
	for {
		m.mu.Lock()
		ec, held := m.ec, m.held
		m.mu.Unlock()
		if held != nil {
			<-held
			continue
		}
		n, err := ec.Write(b[done:])
		done += n
		if err != nil && m.retired(ec) {
			continue
		}
		return done, err
	}
}

// holdInput makes writes wait until as many releaseInput calls, or shutdown. The input stays
// in the stdin FIFO meanwhile.
func (m *ptyMaster) holdInput() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hungUp {
		return
	}
	if m.holds++; m.held == nil {
		m.held = make(chan struct{})
	}
}

func (m *ptyMaster) releaseInput() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holds == 0 {
		return
	}
	if m.holds--; m.holds == 0 {
		close(m.held)
		m.held = nil
	}
}

// swap makes next the master of every copy and closes the old one.
func (m *ptyMaster) swap(next *console.EpollConsole) {
	m.mu.Lock()
	old := m.ec
	m.ec = next
	hungUp := m.hungUp
	m.mu.Unlock()
	if hungUp {
		_ = next.Shutdown(m.ep.CloseConsole)
	}
	// Reads of the old master wait on its epoll events, which stopped with the process (so may
	// a write that found its buffer full): Shutdown wakes them (and unregisters the fd while it
	// is still the old master's), Close makes their retries fail instead of waiting again, and a
	// second wake-up catches one that retried between the two. Each then sees the master retired
	// and moves on. What the process wrote before the dump has been read by then, unless the
	// client has stopped reading its output altogether.
	_ = old.Shutdown(m.ep.CloseConsole)
	_ = old.Close()
	_ = old.Shutdown(func(int) error { return nil })
}

// shutdown hangs up the console (the process exited or stdin closed): pending reads end.
func (m *ptyMaster) shutdown() {
	m.mu.Lock()
	ec, again := m.ec, m.hungUp
	m.hungUp = true
	if m.held != nil { // no more input comes, or nobody reads it: holding it would block its copy
		close(m.held)
		m.held, m.holds = nil, 0
	}
	m.mu.Unlock()
	if !again {
		_ = ec.Shutdown(m.ep.CloseConsole)
	}
}

func (m *ptyMaster) resize(ws console.WinSize) error { return m.current().Resize(ws) }

func (m *ptyMaster) size() (console.WinSize, error) { return m.current().Size() }

// Close closes the current master (the process is deleted).
func (m *ptyMaster) Close() error { return m.current().Close() }
