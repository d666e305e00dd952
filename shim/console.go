package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/containerd/console"
	"github.com/opencontainers/runc/libcontainer/utils"
	"golang.org/x/sys/unix"
)

// consoleSocket is the socket pair over which libcontainer's init sends the pty master
// (libcontainer.Process.ConsoleSocket is the child end).
type consoleSocket struct {
	parent, child *os.File
}

func newConsoleSocket() (*consoleSocket, error) {
	parent, child, err := utils.NewSockPair("console")
	if err != nil {
		return nil, fmt.Errorf("create console socket: %w", err)
	}
	return &consoleSocket{parent: parent, child: child}, nil
}

// errNoConsole is receive's answer when the socket closed without a master: a restored process
// sends one only if it had its terminal open.
var errNoConsole = errors.New("no console master was sent")

// receive returns the pty master the process sent.
func (c *consoleSocket) receive() (console.Console, error) {
	c.child.Close() // a dead process then gives EOF instead of a hang
	// A peek tells EOF (nothing was sent) from a message, which RecvFile cannot.
	var b [1]byte
	n, err := recvPeek(c.parent, b[:])
	if err != nil {
		return nil, fmt.Errorf("receive console master: %w", err)
	}
	if n == 0 {
		return nil, errNoConsole
	}
	f, err := utils.RecvFile(c.parent)
	if err != nil {
		return nil, fmt.Errorf("receive console master: %w", err)
	}
	con, err := console.ConsoleFromFile(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("console from master fd: %w", err)
	}
	return con, nil
}

func (c *consoleSocket) Close() error {
	return closeAll(c.parent, c.child)
}

func recvPeek(f *os.File, b []byte) (int, error) {
	for {
		n, _, err := unix.Recvfrom(int(f.Fd()), b, unix.MSG_PEEK)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// epoller multiplexes every console of the shim, so a console read ends (EOF) when its process
// exits even if something in the container still holds the pty slave.
var (
	epollerOnce sync.Once
	epoller     *console.Epoller
	epollerErr  error
)

func sharedEpoller() (*console.Epoller, error) {
	epollerOnce.Do(func() {
		epoller, epollerErr = console.NewEpoller()
		if epollerErr == nil {
			go epoller.Wait()
		}
	})
	return epoller, epollerErr
}

// epollMaster registers a pty master with the shared epoller.
func epollMaster(master console.Console) (*console.Epoller, *console.EpollConsole, error) {
	ep, err := sharedEpoller()
	if err != nil {
		return nil, nil, fmt.Errorf("console epoller: %w", err)
	}
	ec, err := ep.Add(master)
	if err != nil {
		return nil, nil, fmt.Errorf("add console to epoller: %w", err)
	}
	return ep, ec, nil
}

// attachConsole copies stdin into the console and the console into stdout (a FIFO, a file, or
// the logging binary's pipe). It returns the console used for resize and shutdown.
func (p *processIO) attachConsole(ctx context.Context, master console.Console) (*ptyMaster, error) {
	ep, ec, err := epollMaster(master)
	if err != nil {
		return nil, err
	}
	m := newPtyMaster(ep, ec)
	if p.stdio.Stdin != "" {
		in, err := p.openStdin()
		if err != nil {
			return nil, err
		}
		go func() {
			buf := make([]byte, 4096)
			_, _ = io.CopyBuffer(m, in, buf)
			// stdin closed: hang up the console like a terminal would.
			m.shutdown()
			in.Close()
		}()
	}
	var out io.WriteCloser
	switch {
	case p.logger != nil:
		out = p.logger.outW
	case p.stdio.Stdout != "":
		t, err := parseIOTarget(p.stdio.Stdout)
		if err != nil {
			return nil, err
		}
		outs, err := openSinks(ctx, t, stdio{Stdout: p.stdio.Stdout})
		if err != nil {
			return nil, err
		}
		out = outs[0]
		if t.scheme == "file" {
			out.Close() // the shared writer expects two users; only stdout uses it here
		}
	}
	if out != nil {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			copyAndClose(ctx, out, io.NopCloser(m))
		}()
	}
	return m, nil
}
