package runtime

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// WaitTreeExit blocks until the process of pidfd has exited (it is then a zombie or reaped).
func WaitTreeExit(pidfd *os.File) error {
	fds := []unix.PollFd{{Fd: int32(pidfd.Fd()), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for exec'd process: %w", err)
		}
	}
}

// TreeExitStatus is the wait status of the exited process pid of pidfd, whoever its parent is:
// the pidfd's exit information once the parent reaped it, else its zombie's /proc/PID/stat
// (a PID 1 that never reaps leaves it a zombie). The pidfd is asked again after the stat is
// read: had the zombie been reaped in between (and its pid reused), the pidfd has the status.
func TreeExitStatus(pidfd *os.File, pid int) (unix.WaitStatus, error) {
	if ws, ok := pidfdExit(pidfd); ok {
		return ws, nil
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if ws, ok := pidfdExit(pidfd); ok {
		return ws, nil
	}
	if err != nil {
		return 0, fmt.Errorf("exit status of %d: %w", pid, err)
	}
	state, code, err := parseStatExit(string(data))
	if err != nil {
		return 0, fmt.Errorf("exit status of %d: %w", pid, err)
	}
	if state != "Z" && state != "X" {
		return 0, fmt.Errorf("exit status of %d: it has not exited (state %s)", pid, state)
	}
	return unix.WaitStatus(code), nil
}

// pidfdExit asks the kernel for the exit status a pidfd keeps once its process is reaped.
func pidfdExit(pidfd *os.File) (unix.WaitStatus, bool) {
	info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
	if err := unix.IoctlPidfdInfo(int(pidfd.Fd()), &info); err != nil || info.Mask&unix.PIDFD_INFO_EXIT == 0 {
		return 0, false
	}
	return unix.WaitStatus(info.Exit_code), true
}

// parseStatExit returns the state (field 3) and exit code (field 52) of a /proc/PID/stat line.
func parseStatExit(stat string) (string, int, error) {
	fields, err := statFields(stat, 52)
	if err != nil {
		return "", 0, err
	}
	code, err := strconv.Atoi(fields[49])
	if err != nil {
		return "", 0, fmt.Errorf("exit code field %q: %w", fields[49], err)
	}
	return fields[0], code, nil
}

// errNoNSPid is returned for a kernel without NSpid.
var errNoNSPid = errors.New("no NSpid line")

// nsPid is pid's pid in its innermost PID namespace (the last field of NSpid).
func nsPid(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("pid of %d in its namespace: %w", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			return strconv.Atoi(f[len(f)-1])
		}
	}
	return 0, fmt.Errorf("pid of %d in its namespace: %w", pid, errNoNSPid)
}

// statFields are the fields of a /proc/PID/stat line from field 3 (the state) on, at least up
// to field want. The command (field 2) is parenthesised and may hold spaces and parentheses:
// fields are counted from the last ')'.
func statFields(stat string, want int) ([]string, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed stat %q", stat)
	}
	fields := strings.Fields(stat[i+1:])
	if len(fields) < want-2 {
		return nil, fmt.Errorf("stat has %d fields, want %d", len(fields)+2, want)
	}
	return fields, nil
}

// startTime is pid's start time (field 22 of /proc/PID/stat, clock ticks since boot): with the
// pid, it names one process, whose pid may be reused once it is reaped.
func startTime(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("start time of %d: %w", pid, err)
	}
	fields, err := statFields(string(data), 22)
	if err != nil {
		return 0, fmt.Errorf("start time of %d: %w", pid, err)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// IsZombie reports whether the process pid that started at start has exited and is not reaped.
func IsZombie(pid int, start uint64) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields, err := statFields(string(data), 22)
	return err == nil && fields[0] == "Z" && fields[19] == strconv.FormatUint(start, 10)
}
