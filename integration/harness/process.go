package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a long-running process the harness started (containerd, a registry, a snapshotter), with
// its output in a log file that errors quote from.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error // set when done is closed
}

func startProc(name, logPath string, env []string, bin string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group keeps a Ctrl-C of the test run from reaching it before the harness
	// tears it down in order; the death signal stops it if the test binary is killed outright.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startOnSpawnThread(cmd); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// spawnThread is one OS thread that never exits, for starting processes with a death signal: the
// kernel sends Pdeathsig when the *thread* that forked the child exits, and the Go runtime ends a
// thread whenever a goroutine locked to it returns (containerd's mount code does that for long
// overlay options), which killed containerd in the middle of tests.
var spawnThread = sync.OnceValue(func() chan<- func() {
	requests := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked: the thread lives as long as the test binary
		for f := range requests {
			f()
		}
	}()
	return requests
})

func startOnSpawnThread(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	spawnThread() <- func() { errc <- cmd.Start() }
	return <-errc
}

// waitReady polls ready until it succeeds, the process exits, or timeout passes; failures quote
// the end of the process's log, where the cause usually is.
func (p *proc) waitReady(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%v); end of %s:\n%s", p.name, p.err, p.logPath, p.logTail(15))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %w; end of %s:\n%s", p.name, timeout, err, p.logPath, p.logTail(15))
		}
	}
}

// stop asks the process to exit and kills it if it has not after grace.
func (p *proc) stop(grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s did not exit within %s of SIGTERM and was killed", p.name, grace)
}

func (p *proc) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
