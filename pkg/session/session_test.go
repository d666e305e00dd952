package session

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// hostExecer runs the protocol's execs on this machine: ops.sh and loop.sh are the ones a
// container runs, with the host's sh, bash and /proc.
type hostExecer struct{}

func (hostExecer) Exec(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) && ctx.Err() == nil {
		return exit.ExitCode(), nil
	}
	return cmd.ProcessState.ExitCode(), err
}

func newTestSessions(t *testing.T) *Sessions {
	t.Helper()
	s := New(hostExecer{}, filepath.Join(t.TempDir(), "sessions"))
	t.Cleanup(func() {
		infos, err := s.List(context.Background())
		if err != nil {
			t.Error(err)
		}
		for _, in := range infos {
			if err := s.Close(context.Background(), in.Name); err != nil {
				t.Error(err)
			}
		}
	})
	return s
}

type call struct {
	out, err string
	status   int
}

func run(t *testing.T, s *Sessions, name, command string) call {
	t.Helper()
	var stdout, stderr bytes.Buffer
	res, err := s.Run(context.Background(), name, command, RunOptions{Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		t.Fatalf("run %q: %v", command, err)
	}
	if res.TimedOut {
		t.Fatalf("run %q timed out", command)
	}
	return call{stdout.String(), stderr.String(), res.Status}
}

// TestRun runs calls in order in one session: each sees what the ones before it left.
func TestRun(t *testing.T) {
	s := newTestSessions(t)
	work := t.TempDir()
	for _, c := range []struct {
		command string
		want    call
	}{
		{"cd " + work + "; export X=1; Y=2; f() { echo hi; }", call{}},
		{"pwd; echo $X $Y; f", call{out: work + "\n1 2\nhi\n"}},
		{"false", call{status: 1}},
		{"(exit 3)", call{status: 3}},
		{"echo out; echo err >&2; return 4", call{out: "out\n", err: "err\n", status: 4}},
		{"sleep 1000 >/dev/null 2>&1 & echo $! >bg", call{}},
		{"kill -0 $(cat bg) && echo running", call{out: "running\n"}},
		{"if then", call{status: 2}}, // refused before the shell sees it
		{"printf 'a\\nb' ; printf 'c'", call{out: "a\nbc"}},
		{"echo $X", call{out: "1\n"}},
	} {
		got := run(t, s, "a", c.command)
		if got.out != c.want.out || got.status != c.want.status || (c.want.err != "" && got.err != c.want.err) {
			t.Fatalf("%q: got %+v, want %+v", c.command, got, c.want)
		}
	}
	if got := run(t, s, "b", "echo ${X:-unset}; pwd"); got.out == "1\n"+work+"\n" || !strings.HasPrefix(got.out, "unset\n") {
		t.Fatalf("session b sees session a's state: %q", got.out)
	}
}

// TestBinary checks that 1 MiB of random bytes, newlines and NULs among them, comes out intact.
func TestBinary(t *testing.T) {
	s := newTestSessions(t)
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	file := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got := run(t, s, "bin", "cat "+file+"; cat "+file+" >&2")
	if got.out != string(data) || got.err != string(data) {
		t.Fatalf("got %d bytes on stdout, %d on stderr, not the file's %d", len(got.out), len(got.err), len(data))
	}
}

// TestTimeout checks that a timeout kills the call's processes, not the session or its jobs.
func TestTimeout(t *testing.T) {
	s := newTestSessions(t)
	run(t, s, "t", "export X=1; sleep 1000 >/dev/null 2>&1 & echo $! >"+filepath.Join(t.TempDir(), "bg"))
	before := sessionPID(t, s, "t")
	res, err := s.Run(context.Background(), "t", "sleep 1000", RunOptions{Timeout: 100 * time.Millisecond})
	if err != nil || !res.TimedOut || res.Status != 137 {
		t.Fatalf("sleep 1000 with a timeout: %+v, %v; want timed out with status 137 (SIGKILL)", res, err)
	}
	if got := run(t, s, "t", "echo $X; jobs | wc -l"); got.out != "1\n1\n" {
		t.Fatalf("after the timeout the session printed %q, want its variable and its background job", got.out)
	}
	if after := sessionPID(t, s, "t"); after != before {
		t.Fatalf("the session's shell changed from %d to %d", before, after)
	}
}

// TestExitEndsSession checks that exit reports its status and ends the session, which the next
// call starts afresh.
func TestExitEndsSession(t *testing.T) {
	s := newTestSessions(t)
	run(t, s, "e", "X=1")
	if got := run(t, s, "e", "exit 7"); got.status != 7 {
		t.Fatalf("exit 7: status %d", got.status)
	}
	if got := run(t, s, "e", "echo ${X:-new}"); got.out != "new\n" {
		t.Fatalf("after exit the session printed %q, want a new session's", got.out)
	}
}

// TestListClose checks that List names the live sessions and Close ends one with its jobs.
func TestListClose(t *testing.T) {
	s := newTestSessions(t)
	bg := filepath.Join(t.TempDir(), "bg")
	run(t, s, "one", "sleep 1000 >/dev/null 2>&1 & echo $! >"+bg)
	run(t, s, "two", "true")
	infos, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Name != "one" || infos[1].Name != "two" || infos[0].PID == 0 || infos[0].Created.IsZero() {
		t.Fatalf("List: %+v", infos)
	}
	if err := s.Close(context.Background(), "one"); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []string{strings.TrimSpace(readFile(t, bg)), ""} {
		if pid == "" {
			break
		}
		if _, err := os.Stat("/proc/" + pid + "/cmdline"); err == nil && readFile(t, "/proc/"+pid+"/cmdline") != "" {
			t.Fatalf("the closed session's job %s runs on", pid)
		}
	}
	if err := s.Close(context.Background(), "one"); !errdefs.IsNotFound(err) {
		t.Fatalf("closing a closed session: %v, want not found", err)
	}
	if infos, err := s.List(context.Background()); err != nil || len(infos) != 1 || infos[0].Name != "two" {
		t.Fatalf("List after Close: %+v, %v", infos, err)
	}
}

func TestNames(t *testing.T) {
	for name, ok := range map[string]bool{"default": true, "a.b-c_1": true, "": false, ".x": false, "-x": false, "a/b": false, "a b": false, strings.Repeat("x", 65): false} {
		if err := checkName(name); (err == nil) != ok || (err != nil && !errdefs.IsInvalidArgument(err)) {
			t.Errorf("checkName(%q): %v", name, err)
		}
	}
}

func TestParseList(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []Info
		ok   bool
	}{
		{"", nil, true},
		{"a\t12\t2026-11-28T02:00:00Z\tbash\n", []Info{{"a", 12, time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC), "bash"}}, true},
		{"a\tx\t2026-11-28T02:00:00Z\tbash\n", nil, false},
		{"a\t12\n", nil, false},
	} {
		got, err := parseList(c.in)
		if (err == nil) != c.ok || len(got) != len(c.want) || (len(got) == 1 && got[0] != c.want[0]) {
			t.Errorf("parseList(%q) = %+v, %v", c.in, got, err)
		}
	}
}

func sessionPID(t *testing.T, s *Sessions, name string) int {
	t.Helper()
	infos, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Name == name {
			return in.PID
		}
	}
	t.Fatalf("no session %s in %+v", name, infos)
	return 0
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestStreamed checks that output reaches the writer while the command runs: the command waits
// for a file that the test makes only once it has read the command's first line.
func TestStreamed(t *testing.T) {
	s := newTestSessions(t)
	gate := filepath.Join(t.TempDir(), "gate")
	r, w := io.Pipe()
	done := make(chan error, 1)
	var res Result
	go func() {
		var err error
		res, err = s.Run(context.Background(), "stream", "echo ready; while [ ! -e "+gate+" ]; do sleep 0.01; done; echo done", RunOptions{Stdout: w})
		w.CloseWithError(err)
		done <- err
	}()
	lines := bufio.NewScanner(r)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("first line %q, %v", lines.Text(), lines.Err())
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if !lines.Scan() || lines.Text() != "done" {
		t.Fatalf("second line %q, %v", lines.Text(), lines.Err())
	}
	if err := <-done; err != nil || res.Status != 0 {
		t.Fatalf("run: %+v, %v", res, err)
	}
}

// TestConcurrentStart checks that concurrent first calls of a session start one shell and all
// run in it.
func TestConcurrentStart(t *testing.T) {
	s := newTestSessions(t)
	const n = 4
	outs := make(chan string, n)
	for range n {
		go func() {
			var out bytes.Buffer
			res, err := s.Run(context.Background(), "c", "echo $$", RunOptions{Stdout: &out})
			if err != nil || res.Status != 0 {
				out.WriteString(fmt.Sprintf("failed: %+v %v", res, err))
			}
			outs <- out.String()
		}()
	}
	var got []string
	for range n {
		got = append(got, <-outs)
	}
	pid := fmt.Sprintf("%d\n", sessionPID(t, s, "c"))
	for _, got := range got {
		if got != pid {
			t.Errorf("a concurrent first call printed %q, want the session's pid %q", got, pid)
		}
	}
}

// TestTimeoutShellLoop checks that a timeout ends a command the shell runs itself by ending the
// session, which the next call starts afresh.
func TestTimeoutShellLoop(t *testing.T) {
	s := newTestSessions(t)
	s.killRounds = 3
	run(t, s, "loop", "X=1")
	res, err := s.Run(context.Background(), "loop", "while :; do :; done", RunOptions{Timeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrSessionEnded) || !res.TimedOut || res.Status != FailedStatus {
		t.Fatalf("a loop of builtins with a timeout: %+v, %v; want the session ended, status %d", res, err, FailedStatus)
	}
	if got := run(t, s, "loop", "echo ${X:-new}"); got.out != "new\n" {
		t.Fatalf("after the session ended the next call printed %q, want a new session's", got.out)
	}
}
