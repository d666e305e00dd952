package shim

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/console"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/utils"
	"golang.org/x/sys/unix"
)

// testPty is a pty pair: the master as the shim holds it, the slave as a process holds it.
type testPty struct {
	file   *os.File // the master's file, for sending it over a console socket
	master console.Console
	slave  *os.File
}

func newTestPty(t *testing.T) *testPty {
	t.Helper()
	f, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	master, path, err := console.NewPtyFromFile(f)
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	slave, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		t.Fatal(err)
	}
	// Raw: what one side writes is what the other reads, without echo.
	if err := console.ClearONLCR(slave.Fd()); err != nil {
		t.Fatal(err)
	}
	termios, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	termios.Lflag &^= unix.ECHO | unix.ICANON
	if err := unix.IoctlSetTermios(int(slave.Fd()), unix.TCSETS, termios); err != nil {
		t.Fatal(err)
	}
	p := &testPty{file: f, master: master, slave: slave}
	t.Cleanup(func() {
		p.slave.Close()
		p.master.Close()
	})
	return p
}

// readSlave reads n bytes the master wrote, or fails after a while.
func (p *testPty) readSlave(t *testing.T, n int) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		b := make([]byte, n)
		k, _ := io.ReadFull(p.slave, b)
		got <- string(b[:k])
	}()
	select {
	case s := <-got:
		return s
	case <-time.After(5 * time.Second):
		t.Fatalf("the process side of the pty read nothing")
		return ""
	}
}

// syncBuffer collects a copy's output.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) waitFor(t *testing.T, s string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b.mu.Lock()
		out := b.buf.String()
		b.mu.Unlock()
		if strings.Contains(out, s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the copy shows %q, want %q in it", out, s)
		}
	}
}

func epolled(t *testing.T, p *testPty) (*console.Epoller, *console.EpollConsole) {
	t.Helper()
	ep, ec, err := epollMaster(p.master)
	if err != nil {
		t.Fatal(err)
	}
	return ep, ec
}

// TestPtyMasterSwap: the copies of a console carry on through a swap of its master, with what
// was written while the process was gone delivered to the new one, and end at shutdown.
func TestPtyMasterSwap(t *testing.T) {
	old := newTestPty(t)
	ep, ec := epolled(t, old)
	m := newPtyMaster(ep, ec)

	var out syncBuffer
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(&out, m)
		copied <- err
	}()
	if _, err := old.slave.Write([]byte("before ")); err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "before ")
	if _, err := m.Write([]byte("in1")); err != nil {
		t.Fatal(err)
	}
	if got := old.readSlave(t, 3); got != "in1" {
		t.Fatalf("the process read %q", got)
	}

	// The checkpoint holds the input back, and the process dies: the output copy waits instead
	// of ending, and so does the input.
	m.holdInput()
	old.slave.Close()
	written := make(chan error, 1)
	go func() {
		_, err := m.Write([]byte("typed-meanwhile"))
		written <- err
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-copied:
		t.Fatalf("the output copy ended when the process's side closed: %v", err)
	case err := <-written:
		t.Fatalf("the input write returned while the process was gone: %v", err)
	default:
	}

	next := newTestPty(t)
	_, nec := epolled(t, next)
	m.swap(nec)
	m.releaseInput()
	if err := <-written; err != nil {
		t.Fatalf("the input written across the swap failed: %v", err)
	}
	if got := next.readSlave(t, len("typed-meanwhile")); got != "typed-meanwhile" {
		t.Fatalf("the restored process read %q", got)
	}
	if _, err := next.slave.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "before after")
	if _, err := old.master.Write([]byte("x")); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("the old master is not closed after the swap: write gives %v", err)
	}

	next.slave.Close()
	m.shutdown()
	select {
	case <-copied:
	case <-time.After(5 * time.Second):
		t.Fatal("the output copy did not end at shutdown")
	}
}

// TestPtyMasterSwapAfterHangUp: a console hung up before a swap stays hung up on the new master.
func TestPtyMasterSwapAfterHangUp(t *testing.T) {
	old := newTestPty(t)
	ep, ec := epolled(t, old)
	m := newPtyMaster(ep, ec)
	m.shutdown()
	next := newTestPty(t)
	_, nec := epolled(t, next)
	m.swap(nec)
	next.slave.Close()
	done := make(chan error, 1)
	go func() {
		_, err := m.Read(make([]byte, 16))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a read of a hung up console succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read of a hung up console waits")
	}
}

func TestConsoleSocketReceiveNothing(t *testing.T) {
	cs, err := newConsoleSocket()
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := cs.receive(); !errors.Is(err, errNoConsole) {
		t.Fatalf("receive from a socket nothing was sent on: %v, want errNoConsole", err)
	}
}

// TestConsoleHandover: a restore in place sends the new master over the console socket the
// handover gave it; complete moves the copies onto it with the window size the old one had.
func TestConsoleHandover(t *testing.T) {
	old := newTestPty(t)
	ep, ec := epolled(t, old)
	m := newPtyMaster(ep, ec)
	want := console.WinSize{Height: 33, Width: 111}
	if err := m.resize(want); err != nil {
		t.Fatal(err)
	}
	p := newProcess("init", true, stdio{Terminal: true})
	p.console = m
	h := holdConsole(p)
	defer h.Close()
	written := make(chan error, 1)
	go func() {
		_, err := m.Write([]byte("hi"))
		written <- err
	}()
	old.slave.Close()

	lp := &libcontainer.Process{}
	if err := h.attach(lp); err != nil {
		t.Fatal(err)
	}
	next := newTestPty(t)
	// What libcontainer does with the master CRIU hands it.
	if err := utils.SendFile(lp.ConsoleSocket, next.file); err != nil {
		t.Fatal(err)
	}
	if err := h.complete(context.Background()); err != nil {
		t.Fatal(err)
	}
	ws, err := unix.IoctlGetWinsize(int(next.slave.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		t.Fatal(err)
	}
	if ws.Row != want.Height || ws.Col != want.Width {
		t.Fatalf("the new terminal is %dx%d, want %dx%d as before", ws.Row, ws.Col, want.Height, want.Width)
	}
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	if got := next.readSlave(t, 2); got != "hi" {
		t.Fatalf("the restored process read %q, the input typed during the handover", got)
	}
}

// TestConsoleHandoverWithoutConsole: a process without a console needs no handover.
func TestConsoleHandoverWithoutConsole(t *testing.T) {
	h := holdConsole(newProcess("init", true, stdio{}))
	lp := &libcontainer.Process{}
	if err := h.attach(lp); err != nil || h != nil || lp.ConsoleSocket != nil {
		t.Fatalf("handover of a process without console: %v, %v, socket %v", h, err, lp.ConsoleSocket)
	}
	if err := h.complete(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.Close()
}

// TestConsoleHandoverFailedCheckpoint: a checkpoint that ends before any restore lets the held
// input go to the process, which still runs on its terminal.
func TestConsoleHandoverFailedCheckpoint(t *testing.T) {
	pty := newTestPty(t)
	ep, ec := epolled(t, pty)
	p := newProcess("init", true, stdio{Terminal: true})
	p.console = newPtyMaster(ep, ec)
	h := holdConsole(p)
	written := make(chan error, 1)
	go func() {
		_, err := p.console.Write([]byte("ls"))
		written <- err
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-written:
		t.Fatalf("input was written while held: %v", err)
	default:
	}
	h.Close()
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	if got := pty.readSlave(t, 2); got != "ls" {
		t.Fatalf("the process read %q", got)
	}
}

// TestPtyMasterHolds: input flows again only once every hold is released (a pause and a
// checkpoint hold it together), or at shutdown.
func TestPtyMasterHolds(t *testing.T) {
	pty := newTestPty(t)
	ep, ec := epolled(t, pty)
	m := newPtyMaster(ep, ec)
	write := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := m.Write([]byte("k"))
			done <- err
		}()
		return done
	}
	expectHeld := func(done <-chan error, when string) {
		t.Helper()
		select {
		case err := <-done:
			t.Fatalf("input was written %s: %v", when, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	expectWritten := func(done <-chan error, when string) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("input is still held %s", when)
		}
	}

	m.holdInput() // the pause
	m.holdInput() // the checkpoint
	done := write()
	expectHeld(done, "under two holds")
	m.releaseInput()
	expectHeld(done, "under one hold")
	m.releaseInput()
	expectWritten(done, "once both holds are released")
	m.releaseInput() // one too many: no effect
	expectWritten(write(), "after an extra release")

	m.holdInput()
	done = write()
	expectHeld(done, "under a hold")
	m.shutdown()
	expectWritten(done, "after shutdown")
	m.holdInput() // nothing to hold for once hung up
	expectWritten(write(), "on a hung up console")
}
