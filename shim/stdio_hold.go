package shim

import (
	"fmt"
	"os"
	"strings"

	"github.com/opencontainers/runc/libcontainer"
)

// heldStdio is the shim's own handle on each of a process's stdio pipes, opened through /proc
// before a dump kills the process. Holding them keeps the shim's output copies from seeing EOF
// while the process is down, and the restore hands the very same pipes to CRIU, which matches
// them to the dumped ones: output continues where it stopped, through the same copies.
type heldStdio struct {
	files [3]*os.File // stdin, stdout, stderr; nil where the stream is not a pipe
}

func holdStdio(pid int) (*heldStdio, error) {
	h := &heldStdio{}
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
	return h, nil
}

// attach gives the held pipes to the process being restored.
func (h *heldStdio) attach(lp *libcontainer.Process) {
	if h.files[0] != nil {
		lp.Stdin = h.files[0]
	}
	if h.files[1] != nil {
		lp.Stdout = h.files[1]
	}
	if h.files[2] != nil {
		lp.Stderr = h.files[2]
	}
}

func (h *heldStdio) Close() {
	for _, f := range h.files {
		if f != nil {
			f.Close()
		}
	}
}
