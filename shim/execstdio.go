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

// execStdioFile lists, in a checkpoint's image directory, the stdio pipes and terminals of the
// exec'd processes in the dump (runtime.TreeProcess.Stdio and Tty). A restore that does not
// bring them back to their execs (a rollback, a fork, any restore into a new task) gives CRIU a
// stand-in for each (nullExecStdio): without one, CRIU would restore a pipe whose other end nobody
// holds, and the process's next write to its stdout would fail with EPIPE and kill it (SIGPIPE);
// and it cannot restore an external terminal at all.
const execStdioFile = "cklite-exec-stdio.json"

// execPipe is one stdio pipe of an exec'd process, its fd (0-2) and its identity ("pipe:[N]"), or
// the terminal it runs on, by CRIU's name ("tty[rdev:dev]"), or /dev/tty (Tty) standing for that
// terminal (Of, see runtime.DevTtyAliases).
type execPipe struct {
	Fd   int    `json:"fd"`
	Pipe string `json:"pipe,omitempty"`
	Tty  string `json:"tty,omitempty"`
	Of   string `json:"of,omitempty"`
}

// writeExecStdio records the stdio pipes and terminals of the running execs of c's tree into dir,
// and returns what it recorded.
func writeExecStdio(c *container, dir string) ([]execPipe, error) {
	var pipes []execPipe
	sessions := map[int]string{} // an exec on a terminal leads its session
	for _, p := range c.treeExecs() {
		tp := p.treeProcess()
		for fd, name := range tp.Stdio {
			if strings.HasPrefix(name, "pipe:") {
				pipes = append(pipes, execPipe{Fd: fd, Pipe: name})
			}
		}
		if tp.Tty != "" {
			pipes = append(pipes, execPipe{Tty: tp.Tty})
			sessions[tp.Pid] = tp.Tty
		}
	}
	standIns := c.standIns.list()
	for _, name := range standIns {
		pipes = append(pipes, execPipe{Tty: name})
	}
	if len(sessions) > 0 || len(standIns) > 0 {
		pids, err := c.engine().Pids()
		if err != nil {
			return nil, err
		}
		runtime.TtySessions(pids, standIns, sessions)
		aliases, err := runtime.DevTtyAliases(pids, sessions)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", c.id, err)
		}
		for devTty, tty := range aliases {
			pipes = append(pipes, execPipe{Tty: devTty, Of: tty})
		}
	}
	if len(pipes) == 0 {
		return nil, nil
	}
	data, err := json.Marshal(pipes)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint image directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, execStdioFile), data, 0o600); err != nil {
		return nil, fmt.Errorf("record the stdio of exec'd processes: %w", err)
	}
	return pipes, nil
}

// readExecStdio reads what writeExecStdio recorded in dir: none if nothing was. The directory
// may come from elsewhere: every entry must name a stdio pipe or a terminal.
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
	ttys := map[string]bool{}
	for _, p := range pipes {
		if p.Of == "" {
			ttys[p.Tty] = true
		}
	}
	for _, p := range pipes {
		pipe := p.Tty == "" && p.Of == "" && p.Fd >= 0 && p.Fd <= 2 && runtime.IsPipeName(p.Pipe)
		tty := p.Pipe == "" && runtime.IsTtyName(p.Tty) && (p.Of == "" || ttys[p.Of] && !ttys[p.Tty])
		if !pipe && !tty {
			return nil, fmt.Errorf("%s in %s: %+v is neither a stdio pipe nor a terminal", execStdioFile, dir, p)
		}
	}
	return pipes, nil
}

// nullExecStdio gives CRIU, for each exec'd process's stdio pipe recorded in dir, a pipe that
// behaves like /dev/null: stdin reads EOF, output is discarded without blocking; and for each
// terminal, a new pty whose output is discarded and which gets no input (nullTty).
func nullExecStdio(dir string, standIns *ttyStandIns) (*treeHold, error) {
	h := &treeHold{release: func() {}}
	pipes, err := readExecStdio(dir)
	if err != nil || len(pipes) == 0 {
		return h, err
	}
	stand := map[string]*os.File{}
	for _, p := range pipes {
		name := p.Pipe + p.Tty
		if stand[name] != nil || p.Of != "" {
			continue
		}
		var f *os.File
		if p.Tty != "" {
			f, err = nullTty(standIns)
		} else {
			f, err = nullPipe(p.Fd == 0)
		}
		if err != nil {
			h.Close()
			return nil, err
		}
		stand[name] = f
		h.files = append(h.files, f)
	}
	aliasTtys(pipes, stand)
	if h.options, h.release, err = runtime.InheritPipes(stand); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}
