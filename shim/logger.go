package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/log"
)

// loggerTermTimeout is how long a logging binary gets to flush after SIGTERM.
const loggerTermTimeout = 12 * time.Second

// logger is a binary:// logging program (containerd's shim logging protocol): it gets the
// stdout and stderr pipes as fds 3 and 4 and signals readiness on fd 5.
type logger struct {
	cmd        *exec.Cmd
	outW, errW *os.File // write ends, for the process (or the console copy)
	waited     chan error
	reaper     *reaper
}

func startLogger(ctx context.Context, id string, t ioTarget, r *reaper) (_ *logger, retErr error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	defer func() {
		if retErr != nil {
			closeAll(files...)
		}
	}()
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create logger stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(outR, outW)
		return nil, fmt.Errorf("create logger stderr pipe: %w", err)
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		closeAll(outR, outW, errR, errW)
		return nil, fmt.Errorf("create logger ready pipe: %w", err)
	}
	files = append(files, outR, outW, errR, errW, readyR, readyW)

	cmd := loggerCmd(t.uri, id, ns)
	cmd.ExtraFiles = []*os.File{outR, errR, readyW}
	// The reaper must not take the logger's exit from cmd.Wait.
	release := r.hold()
	err = cmd.Start()
	if err == nil {
		r.own(cmd.Process.Pid)
	}
	release()
	if err != nil {
		return nil, fmt.Errorf("start logging binary %s: %w", t.uri.Path, err)
	}
	l := &logger{cmd: cmd, outW: outW, errW: errW, waited: make(chan error, 1), reaper: r}
	go func() {
		err := cmd.Wait()
		r.disown(cmd.Process.Pid)
		l.waited <- err
	}()
	closeAll(outR, errR, readyW)

	// binary-v2 requires a ready byte; binary accepts EOF as ready (compatibility).
	b := make([]byte, 1)
	n, err := readyR.Read(b)
	readyR.Close()
	if err != nil && err != io.EOF {
		l.kill()
		return nil, fmt.Errorf("read readiness of logging binary: %w", err)
	}
	if t.scheme == "binary-v2" && n == 0 {
		l.kill()
		return nil, errors.New("logging binary did not call ready (it may have crashed or exited prematurely)")
	}
	return l, nil
}

// loggerCmd is containerd's logging binary command line and environment.
func loggerCmd(u *url.URL, id, ns string) *exec.Cmd {
	var args []string
	for k, vs := range u.Query() {
		args = append(args, k)
		if len(vs) > 0 {
			args = append(args, vs[0])
		}
	}
	cmd := exec.Command(u.Path, args...)
	cmd.Env = append(cmd.Env,
		"CONTAINER_ID="+id,
		"CONTAINER_NAMESPACE="+ns,
	)
	return cmd
}

func (l *logger) kill() {
	closeAll(l.outW, l.errW)
	_ = l.cmd.Process.Kill()
	<-l.waited
}

// Close closes the pipes, then gives the logger time to flush before killing it.
func (l *logger) Close() error {
	closeAll(l.outW, l.errW)
	if err := l.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		_ = l.cmd.Process.Kill()
		return nil
	}
	select {
	case <-l.waited:
	case <-time.After(loggerTermTimeout):
		log.L.WithField("logger", l.cmd.Path).Warn("logging binary did not exit after SIGTERM, killing")
		_ = l.cmd.Process.Kill()
	}
	return nil
}
