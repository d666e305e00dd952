package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cklite/cklite/runtime"
)

// execStdioFile lists, in a checkpoint's image directory, the stdio pipes of the exec'd processes
// in the dump (runtime.TreeProcess.Stdio). A restore that does not bring them back to their execs
// (a rollback, a fork, any restore into a new task) gives CRIU a stand-in for each
// (nullExecStdio): without one, CRIU would restore a pipe whose other end nobody holds, and the
// process's next write to its stdout would fail with EPIPE and kill it (SIGPIPE).
const execStdioFile = "cklite-exec-stdio.json"

// execPipe is one stdio pipe of an exec'd process: its fd (0-2) and its identity ("pipe:[N]").
type execPipe struct {
	Fd   int    `json:"fd"`
	Pipe string `json:"pipe"`
}

// writeExecStdio records the stdio pipes of the running execs of c's tree into dir.
func writeExecStdio(c *container, dir string) error {
	var pipes []execPipe
	for _, p := range c.treeExecs() {
		for fd, name := range p.treeProcess().Stdio {
			if strings.HasPrefix(name, "pipe:") {
				pipes = append(pipes, execPipe{Fd: fd, Pipe: name})
			}
		}
	}
	if len(pipes) == 0 {
		return nil
	}
	data, err := json.Marshal(pipes)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint image directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, execStdioFile), data, 0o600); err != nil {
		return fmt.Errorf("record the stdio of exec'd processes: %w", err)
	}
	return nil
}

// readExecStdio reads what writeExecStdio recorded in dir: none if nothing was. The directory
// may come from elsewhere: every entry must name a pipe and a stdio fd.
func readExecStdio(dir string) ([]execPipe, error) {
	data, err := os.ReadFile(filepath.Join(dir, execStdioFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("stdio of exec'd processes: %w", err)
	}
	var pipes []execPipe
	if err := json.Unmarshal(data, &pipes); err != nil {
		return nil, fmt.Errorf("%s in %s: %w", execStdioFile, dir, err)
	}
	for _, p := range pipes {
		if p.Fd < 0 || p.Fd > 2 || !runtime.IsPipeName(p.Pipe) {
			return nil, fmt.Errorf("%s in %s: %+v is not a stdio pipe", execStdioFile, dir, p)
		}
	}
	return pipes, nil
}

// nullExecStdio gives CRIU, for each exec'd process's stdio pipe recorded in dir, a pipe that
// behaves like /dev/null: stdin reads EOF, output is discarded without blocking.
func nullExecStdio(dir string) (*treeHold, error) {
	h := &treeHold{release: func() {}}
	pipes, err := readExecStdio(dir)
	if err != nil || len(pipes) == 0 {
		return h, err
	}
	stand := map[string]*os.File{}
	for _, p := range pipes {
		if stand[p.Pipe] != nil {
			continue
		}
		f, err := nullPipe(p.Fd == 0)
		if err != nil {
			h.Close()
			return nil, err
		}
		stand[p.Pipe] = f
		h.files = append(h.files, f)
	}
	if h.options, h.release, err = runtime.InheritPipes(stand); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}
