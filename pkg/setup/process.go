package setup

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// process is a daemon as its pid file records it: its pid and its start time (field 22 of
// /proc/PID/stat), so that a pid the kernel gave to another process since is not taken for it.
type process struct {
	pid   int
	start string
}

func recordPID(path string, pid int) (process, error) {
	start, err := startTime(pid)
	if err != nil {
		return process{}, err
	}
	p := process{pid: pid, start: start}
	return p, os.WriteFile(path, fmt.Appendf(nil, "%d %s\n", pid, start), 0o644)
}

func readPIDFile(path string) (process, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return process{}, err
	}
	var p process
	if _, err := fmt.Sscanf(string(b), "%d %s", &p.pid, &p.start); err != nil {
		return process{}, fmt.Errorf("pid file %s: %w", path, err)
	}
	return p, nil
}

// alive reports whether p still runs (an exited process not yet reaped does not).
func (p process) alive() bool {
	start, err := startTime(p.pid)
	return err == nil && start == p.start && !zombie(p.pid)
}

// terminate sends p SIGTERM and waits for its exit, then SIGKILL after timeout. It holds a pidfd
// of p while it does, so that the pid cannot name another process meanwhile; the daemon is not
// the caller's child, so the pidfd's readiness, not wait(2), says it exited.
func (p process) terminate(timeout time.Duration) error {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd of %d: %w", p.pid, err)
	}
	defer unix.Close(fd)
	if start, err := startTime(p.pid); err != nil || start != p.start {
		return nil // gone; the pid is someone else's now
	}
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signal %d: %w", p.pid, err)
		}
		if exited, err := waitPidfd(fd, timeout); err != nil || exited {
			return err
		}
	}
	return fmt.Errorf("pid %d still runs %s after SIGKILL", p.pid, timeout)
}

// waitPidfd waits up to timeout for the process of pidfd fd to exit.
func waitPidfd(fd int, timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(max(0, time.Until(deadline).Milliseconds())))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return false, fmt.Errorf("poll pidfd: %w", err)
		}
		return n > 0, nil
	}
}

// startTime is field 22 of /proc/pid/stat: when the process started, in clock ticks since boot.
func startTime(pid int) (string, error) {
	f, err := statFields(pid)
	if err != nil {
		return "", err
	}
	return f[19], nil // fields after the command: 3 (state) is f[0], 22 is f[19]
}

func zombie(pid int) bool {
	f, err := statFields(pid)
	return err == nil && f[0] == "Z"
}

// statFields are the fields of /proc/pid/stat after the command name (which may hold spaces).
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: %w", pid, syscall.EINVAL)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields: %w", pid, len(f), syscall.EINVAL)
	}
	return f, nil
}
