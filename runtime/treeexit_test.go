package runtime

import (
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseStatExit(t *testing.T) {
	tail := " 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 "
	for _, tc := range []struct {
		name, stat string
		state      string
		code       int
		bad        bool
	}{
		{name: "exit 3", stat: "12 (sh) Z" + tail + "768", state: "Z", code: 768},
		{name: "killed", stat: "12 (sleep) Z" + tail + "9", state: "Z", code: 9},
		{name: "command with spaces and parens", stat: "12 (a) b (c)) Z" + tail + "256", state: "Z", code: 256},
		{name: "running", stat: "12 (sh) S" + tail + "0", state: "S", code: 0},
		{name: "short", stat: "12 (sh) Z 1 2", bad: true},
		{name: "no command", stat: "12 sh Z", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, code, err := parseStatExit(tc.stat)
			if tc.bad {
				if err == nil {
					t.Fatalf("parsed %q", tc.stat)
				}
				return
			}
			if err != nil || state != tc.state || code != tc.code {
				t.Fatalf("got %q %d %v, want %q %d", state, code, err, tc.state, tc.code)
			}
		})
	}
}

// TestTreeExitStatus reads the status of a zombie (from its stat) and of the same process once
// reaped by its parent (from the pidfd), for an exit and a kill.
func TestTreeExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		want   unix.WaitStatus
	}{
		{name: "exit 0", script: "exit 0", want: 0},
		{name: "exit 1", script: "exit 1", want: 1 << 8},
		{name: "exit 255", script: "exit 255", want: 255 << 8},
		{name: "killed", script: "kill -9 $$", want: 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, pidfd := exitedChild(t, "sh", "-c", tc.script)
			if ws, err := TreeExitStatus(pidfd, cmd.Process.Pid); err != nil || ws != tc.want {
				t.Fatalf("zombie: got %v %v, want %v", ws, err, tc.want)
			}
			_ = cmd.Wait()
			if ws, err := TreeExitStatus(pidfd, cmd.Process.Pid); err != nil || ws != tc.want {
				t.Fatalf("reaped: got %v %v, want %v", ws, err, tc.want)
			}
		})
	}
}

// exitedChild starts name args and waits, through a pidfd, for it to exit: it is then a zombie
// until cmd.Wait.
func exitedChild(t *testing.T, name string, args ...string) (*exec.Cmd, *os.File) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	pidfd := os.NewFile(uintptr(fd), "pidfd")
	t.Cleanup(func() { pidfd.Close() })
	if err := WaitTreeExit(pidfd); err != nil {
		t.Fatal(err)
	}
	return cmd, pidfd
}

// TestIsZombie: a process is a zombie from its exit until its parent reaps it, and only under
// the start time it was read with (a reused pid is another process).
func TestIsZombie(t *testing.T) {
	cmd, _ := exitedChild(t, "true")
	pid := cmd.Process.Pid
	start, err := startTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	if !IsZombie(pid, start) {
		t.Fatalf("exited, unreaped %d is not a zombie", pid)
	}
	if IsZombie(pid, start+1) {
		t.Fatalf("%d is a zombie under another start time", pid)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if IsZombie(pid, start) {
		t.Fatalf("reaped %d is still a zombie", pid)
	}
}
