package shim

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// zombie starts a process that exits at once and waits, without reaping it, until it is a
// zombie of the test (waitid with WNOWAIT).
func zombie(t *testing.T, code int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", "exit "+strconv.Itoa(code))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatalf("wait for pid %d to exit: %v", cmd.Process.Pid, err)
	}
	return cmd
}

// state is the process state letter from /proc/<pid>/stat, "" once the pid is gone.
func state(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return fields[0]
}

func TestReaperLeavesOwnedChildren(t *testing.T) {
	r := newReaper()
	cmd := zombie(t, 3)
	r.own(cmd.Process.Pid)
	r.reap()
	if err := cmd.Wait(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 3 {
		t.Fatalf("owned child's exit was stolen: %v", err)
	}
}

func TestReaperReapsOrphans(t *testing.T) {
	r := newReaper()
	cmd := zombie(t, 0)
	r.reap()
	if s := state(cmd.Process.Pid); s != "" {
		t.Fatalf("unowned zombie not reaped (state %q)", s)
	}
}

func TestReaperStandsAsideWhileHeld(t *testing.T) {
	r := newReaper()
	release := r.hold()
	cmd := zombie(t, 0)
	r.reap()
	if s := state(cmd.Process.Pid); s != "Z" {
		t.Fatalf("reaped while held (state %q)", s)
	}
	release()
	r.catchUp.Wait() // the catch-up runs in the background
	if s := state(cmd.Process.Pid); s != "" {
		t.Fatalf("release did not catch up (state %q)", s)
	}
	release() // idempotent
}
