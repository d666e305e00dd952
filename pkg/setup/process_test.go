package setup

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// startChild starts argv and reaps it when the test ends.
func startChild(t *testing.T, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func TestTerminate(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
	}{
		{"exits at SIGTERM", []string{"sleep", "600"}},
		// SIGTERM ignored: SIGKILL after the timeout. exec keeps the shell's pid for sleep.
		{"ignores SIGTERM", []string{"sh", "-c", "trap '' TERM; exec sleep 600"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := startChild(t, tc.argv...)
			pidFile := filepath.Join(t.TempDir(), "x.pid")
			if _, err := recordPID(pidFile, cmd.Process.Pid); err != nil {
				t.Fatal(err)
			}
			p, err := readPIDFile(pidFile)
			if err != nil || p.pid != cmd.Process.Pid || !p.alive() {
				t.Fatalf("pid file: %+v, %v; alive %v", p, err, p.alive())
			}
			if err := p.terminate(300 * time.Millisecond); err != nil {
				t.Fatal(err)
			}
			// Exited, not yet reaped (a zombie): no longer alive.
			if p.alive() {
				t.Fatal("alive after terminate")
			}
			_ = cmd.Wait()
			if err := p.terminate(time.Second); err != nil {
				t.Fatalf("terminate of a reaped process: %v", err)
			}
		})
	}
}

// A pid file whose start time is not the process's names another process: it is left alone.
func TestPIDOfAnotherProcess(t *testing.T) {
	cmd := startChild(t, "sleep", "600")
	p := process{pid: cmd.Process.Pid, start: "1"}
	if p.alive() {
		t.Fatal("a stale record taken for the process")
	}
	if err := p.terminate(time.Second); err != nil {
		t.Fatal(err)
	}
	if start, err := startTime(cmd.Process.Pid); err != nil || zombie(cmd.Process.Pid) {
		t.Fatalf("the unrelated process was signalled: start %s, %v", start, err)
	}
}
