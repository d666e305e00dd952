package shim

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/opencontainers/runc/libcontainer"
)

// heldStdio is the shim's own handle on each of a process's stdio pipes, opened through /proc
// before a dump kills the process. Holding them keeps the shim's output copies from seeing EOF
// while the process is down, and the restore hands the very same pipes to CRIU, which matches
// them to the dumped ones: output continues where it stopped, through the same copies.
// A terminal cannot be held that way (see tty_restore.go): its input is held back instead, and
// its copies move to the new pty the restore sends.
type heldStdio struct {
	files   [3]*os.File // stdin, stdout, stderr; nil where the stream is not a pipe
	console *consoleHandover
}

func holdStdio(p *process) (*heldStdio, error) {
	h := &heldStdio{}
	pid := p.getPid()
	for fd, flag := range []int{os.O_RDONLY, os.O_WRONLY, os.O_WRONLY} {
		path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
		target, err := os.Readlink(path)
		if err != nil || !strings.HasPrefix(target, "pipe:") {
			continue // /dev/null, a terminal or a closed fd: CRIU restores those itself
		}
		f, err := os.OpenFile(path, flag, 0)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("hold stdio pipe %s (%s) across the checkpoint: %w", path, target, err)
		}
		h.files[fd] = f
	}
	h.console = holdConsole(p)
	return h, nil
}

// attach gives the held pipes to the process being restored, and a console socket for the new
// master of its terminal.
func (h *heldStdio) attach(lp *libcontainer.Process) error {
	if h.files[0] != nil {
		lp.Stdin = h.files[0]
	}
	if h.files[1] != nil {
		lp.Stdout = h.files[1]
	}
	if h.files[2] != nil {
		lp.Stderr = h.files[2]
	}
	return h.console.attach(lp)
}

// restored moves the terminal's copies to the restored process's new pty.
func (h *heldStdio) restored(ctx context.Context) error {
	return h.console.complete(ctx)
}

func (h *heldStdio) Close() {
	for _, f := range h.files {
		if f != nil {
			f.Close()
		}
	}
	h.console.Close()
}
