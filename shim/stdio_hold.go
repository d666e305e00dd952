package shim

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/opencontainers/runc/libcontainer"

	"github.com/cklite/cklite/runtime"
)

// heldStdio is the shim's own handle on each of the init's stdio pipes, opened through /proc
// before a dump kills the process. Holding them keeps the shim's output copies from seeing EOF
// while the process is down, and the restore hands the very same pipes to CRIU, which matches
// them to the dumped ones: output continues where it stopped, through the same copies.
//
// The pipes are held by identity: the ones libcontainer recorded as the init's stdio when it
// started or restored it (what the dump writes into descriptors.json), found on whichever fd of
// the container's processes still holds them. Reading the init's fds 0-2 at the moment of the
// checkpoint instead is a race: a shell running `echo ... >file` has fd 1 on the file for a
// moment, with the pipe parked on fd 10; the restore then got no pipe for stdout, CRIU was handed
// the shim's /dev/null for it and put that in place of the pipe in every process, and every later
// dump failed ("Can't lookup mount=24 for fd=1 path=/dev/null", issue 16 item 6).
// A terminal cannot be held that way (see tty_restore.go): its input is held back instead, and
// its copies move to the new pty the restore sends.
type heldStdio struct {
	files   [3]*os.File // stdin, stdout, stderr; nil where the stream is not a pipe
	console *consoleHandover
}

func holdStdio(p *process, engine engine) (*heldStdio, error) {
	names, err := engine.Stdio()
	if err != nil {
		return nil, err
	}
	pids := []int{p.getPid()}
	if all, err := engine.Pids(); err == nil {
		pids = append(pids, all...)
	}
	h := &heldStdio{}
	for fd, flag := range []int{os.O_RDONLY, os.O_WRONLY, os.O_WRONLY} {
		if !strings.HasPrefix(names[fd], "pipe:") {
			continue // /dev/null, a terminal or a closed fd: CRIU restores those itself
		}
		f, err := runtime.OpenPipe(names[fd], flag, pids)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("hold stdio %d (%s) across the checkpoint: %w", fd, names[fd], err)
		}
		if f == nil {
			// No process holds the pipe any more: nothing will be restored onto it, but
			// CRIU still gets a pipe for it, never the shim's /dev/null.
			if f, err = nullPipe(fd == 0); err != nil {
				h.Close()
				return nil, err
			}
		}
		h.files[fd] = f
	}
	h.console = holdConsole(p)
	return h, nil
}

// nullPipe is a pipe end that behaves like /dev/null from inside the container: a read end
// that reads EOF, or a write end whose output is discarded.
func nullPipe(read bool) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create stdio pipe: %w", err)
	}
	if read {
		w.Close()
		return r, nil
	}
	go func() {
		_, _ = io.Copy(io.Discard, r)
		r.Close()
	}()
	return w, nil
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
