package integration

// TestExecSession drives `cklite exec` sessions (pkg/session) in cklite containers: state that
// persists between calls, exit statuses, separate and binary output, timeouts, and the session
// carried by a leave-running checkpoint, an in-place rollback and a fork.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/session"
)

// sessionCall is what one `cklite exec` printed and its exit status.
type sessionCall struct {
	out, err string
	status   int
}

// ckliteExec runs `cklite exec ARGS...` against d and returns its stdout, stderr and status.
func ckliteExec(t *testing.T, d *harness.Daemon, args ...string) sessionCall {
	t.Helper()
	cmd := d.Command(context.Background(), "cklite", append([]string{"--address", d.Address, "-n", d.Namespace, "exec"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("cklite exec %q did not run: %v", args, err)
	}
	return sessionCall{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

// inSession runs command in container id's default session and fails the test unless it exits 0
// with nothing on stderr; it returns its stdout.
func inSession(t *testing.T, d *harness.Daemon, id, command string) string {
	t.Helper()
	c := ckliteExec(t, d, id, "--", command)
	if c.status != 0 || c.err != "" {
		t.Fatalf("cklite exec %s -- %q: status %d, stderr %q", id, command, c.status, c.err)
	}
	return c.out
}

// sessions lists container id's sessions with `cklite exec --list --format json`.
func sessions(t *testing.T, d *harness.Daemon, id string) []session.Info {
	t.Helper()
	var infos []session.Info
	if err := json.Unmarshal([]byte(cklite(t, d, "exec", "--list", "--format", "json", id)), &infos); err != nil {
		t.Fatal(err)
	}
	return infos
}

func TestExecSession(t *testing.T) {
	e := newCkEnv(t)
	// start starts container name on img with the Go client; the session is then named by id.
	start := func(t *testing.T, name string, img client.Image) (string, string) {
		c := e.newContainer(t, name, img, counterSpec)
		if _, err := startTask(e.ctx, c); err != nil {
			t.Fatalf("starting %s: %v", name, err)
		}
		return name, name
	}
	for _, tc := range []struct {
		name  string
		start func(t *testing.T, name string) (ref, id string)
		shell string // the session's: bash where the image has it
	}{
		{"busybox", func(t *testing.T, name string) (string, string) { return start(t, name, e.img) }, "sh"},
		{"debian", func(t *testing.T, name string) (string, string) { return start(t, name, e.sandboxImage(t)) }, "bash"},
		// nerdctl's container, named by its nerdctl name.
		{"nerdctl", func(t *testing.T, name string) (string, string) {
			id := runDetached(t, e.d, harness.CkliteRuntime, name, []string{"--snapshotter", ckliteSnapshotter}, "sh", "-c", workload.CounterScript)
			waitForStatus(t, e.d, name, "running")
			return name, id
		}, "sh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref, id := tc.start(t, "session-"+tc.name)
			pid := e.checkSessionCalls(t, ref, e.d.RootfsPath(id), tc.shell)
			e.checkSessionCheckpoint(t, ref, pid)
			cklite(t, e.d, "exec", "--close", ref)
			if infos := sessions(t, e.d, ref); len(infos) != 0 {
				t.Fatalf("sessions after --close: %+v", infos)
			}
			ckliteMisuse(t, e.d, "want CONTAINER -- COMMAND", "exec", ref)
		})
	}
}

// checkSessionCalls checks a session's calls in the container id names (id, or nerdctl name),
// whose rootfs is mounted at rootfs, and returns its shell's pid.
func (e *ckEnv) checkSessionCalls(t *testing.T, id, rootfs, shell string) int {
	t.Helper()
	inSession(t, e.d, id, "mkdir -p /work; cd /work; export X=1; Y=v; f() { echo hi; }")
	if got := inSession(t, e.d, id, "pwd; echo $X $Y; f"); got != "/work\n1 v\nhi\n" {
		t.Fatalf("the second call printed %q, want the first's cwd, variables and function", got)
	}
	for _, c := range []struct {
		command string
		want    sessionCall
	}{
		{"false", sessionCall{status: 1}},
		{"(exit 3)", sessionCall{status: 3}},
		{"echo out; echo err >&2; (exit 255)", sessionCall{"out\n", "err\n", 255}},
	} {
		if got := ckliteExec(t, e.d, id, "--", c.command); got != c.want {
			t.Fatalf("%q: got %+v, want %+v", c.command, got, c.want)
		}
	}
	// 1 MiB of random bytes, through the CLI, as the container's file holds them.
	inSession(t, e.d, id, "head -c 1048576 /dev/urandom >/tmp/bin")
	want, err := os.ReadFile(filepath.Join(rootfs, "tmp", "bin"))
	if err != nil || len(want) != 1<<20 {
		t.Fatalf("the container's /tmp/bin: %d bytes, %v", len(want), err)
	}
	if got := inSession(t, e.d, id, "cat /tmp/bin"); got != string(want) {
		t.Fatalf("cat of 1 MiB printed %d bytes, not the file's", len(got))
	}
	e.checkSessionStreams(t, id, rootfs)
	start := time.Now()
	inSession(t, e.d, id, "true")
	logTiming(t, "cklite exec -- true, in a running session", start)
	// A timeout kills the command, the session answers the next call.
	if got := ckliteExec(t, e.d, "--timeout", "1s", id, "--", "sleep 1000"); got.status != 124 || !strings.Contains(got.err, "timed out") {
		t.Fatalf("sleep 1000 with --timeout 1s: %+v, want status 124 and a message", got)
	}
	if got := inSession(t, e.d, id, "echo $X"); got != "1\n" {
		t.Fatalf("after a timeout the session printed %q", got)
	}
	infos := sessions(t, e.d, id)
	if len(infos) != 1 || infos[0].Name != session.DefaultName || infos[0].Shell != shell {
		t.Fatalf("sessions: %+v, want one default session running %s", infos, shell)
	}
	if got := cklite(t, e.d, "exec", "--list", "-q", id); got != session.DefaultName+"\n" {
		t.Fatalf("exec --list -q printed %q", got)
	}
	// The claim the design rests on: the exec that started the shell is gone, the shell is a child
	// of the container's PID 1, in the tree a checkpoint dumps.
	if got := inSession(t, e.d, id, "echo $$; read -r _ _ _ ppid _ </proc/$$/stat; echo $ppid"); got != strconv.Itoa(infos[0].PID)+"\n1\n" {
		t.Fatalf("the session's shell and its parent: %q, want %d and 1", got, infos[0].PID)
	}
	return infos[0].PID
}

// checkSessionStreams checks that `cklite exec` prints a command's output while it runs: the
// command waits for a file that the test makes in the container's rootfs only once it has read
// the command's first line.
func (e *ckEnv) checkSessionStreams(t *testing.T, id, rootfs string) {
	t.Helper()
	startGatedCall(t, e.d, id, rootfs, "true").finish(t)
}

// gatedCall is a `cklite exec` call that prints its first line, then waits for /tmp/gate in the
// container, then runs after and prints its last line: a test reads the first line, acts while
// the call runs, and opens the gate.
type gatedCall struct {
	cmd   *exec.Cmd
	lines *bufio.Scanner
	gate  string // on the host
}

func startGatedCall(t *testing.T, d *harness.Daemon, id, rootfs, after string) *gatedCall {
	t.Helper()
	cmd := d.Command(context.Background(), "cklite", "--address", d.Address, "-n", d.Namespace, "exec", id, "--",
		"echo first; while [ ! -e /tmp/gate ]; do sleep 0.01; done; "+after+"; echo last")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g := &gatedCall{cmd, bufio.NewScanner(stdout), filepath.Join(rootfs, "tmp", "gate")}
	g.expectLine(t, "first")
	return g
}

func (g *gatedCall) expectLine(t *testing.T, want string) {
	t.Helper()
	if !g.lines.Scan() || g.lines.Text() != want {
		t.Fatalf("cklite exec printed %q (%v), want %q", g.lines.Text(), g.lines.Err(), want)
	}
}

// open makes the gate the call waits for.
func (g *gatedCall) open(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(g.gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// finish opens the gate and expects the call's last line and success.
func (g *gatedCall) finish(t *testing.T) {
	t.Helper()
	g.open(t)
	g.expectLine(t, "last")
	if err := g.cmd.Wait(); err != nil {
		t.Fatalf("cklite exec: %v", err)
	}
}

// checkSessionCheckpoint checkpoints container id (leaving it running), changes its session, rolls
// it back and checks the session is back; then forks the checkpoint and checks the fork's session
// is its own.
func (e *ckEnv) checkSessionCheckpoint(t *testing.T, id string, pid int) {
	t.Helper()
	job := strings.TrimSpace(inSession(t, e.d, id, "sleep 1000 >/dev/null 2>&1 & echo $!"))
	ck := strings.TrimSpace(cklite(t, e.d, "checkpoint", "create", "-q", id))
	state := "pwd; echo $X $Y; f; echo $$; kill -0 " + job + " && echo job"
	wantState := "/work\n1 v\nhi\n" + strconv.Itoa(pid) + "\njob\n"
	if got := inSession(t, e.d, id, state); got != wantState {
		t.Fatalf("after the checkpoint the session printed %q, want %q", got, wantState)
	}
	inSession(t, e.d, id, "export X=2; Y=changed; cd /; unset -f f; kill "+job)
	cklite(t, e.d, "rollback", id, ck)
	if got := inSession(t, e.d, id, state); got != wantState {
		t.Fatalf("after the rollback the session printed %q, want %q (its state at the checkpoint)", got, wantState)
	}

	fork := strings.TrimSpace(cklite(t, e.d, "fork", "-q", "--prefix", "session-fork", ck))
	defer func() {
		mustCtr(t, e.d, "tasks", "delete", "-f", fork)
		mustCtr(t, e.d, "containers", "delete", fork)
	}()
	if got := inSession(t, e.d, fork, state); got != wantState {
		t.Fatalf("the fork's session printed %q, want %q", got, wantState)
	}
	inSession(t, e.d, fork, "export X=fork; cd /tmp")
	inSession(t, e.d, id, "export X=parent")
	if got := inSession(t, e.d, fork, "pwd; echo $X"); got != "/tmp\nfork\n" {
		t.Fatalf("the fork's session printed %q after the parent's changed", got)
	}
	if got := inSession(t, e.d, id, "pwd; echo $X"); got != "/work\nparent\n" {
		t.Fatalf("the parent's session printed %q after the fork's changed", got)
	}
}

// TestExecSessionMidCall checkpoints a container while a `cklite exec` call runs in its session
// (the call's exec is in the dumped tree, docs/checkpoints.md): the call ends as usual, and after
// a rollback to that checkpoint the call runs on from where it was, to its end, and the session
// answers the next call with what the call left.
func TestExecSessionMidCall(t *testing.T) {
	e := newCkEnv(t)
	id := "session-midcall"
	c := e.newContainer(t, id, e.img, counterSpec)
	if _, err := startTask(e.ctx, c); err != nil {
		t.Fatalf("starting %s: %v", id, err)
	}
	inSession(t, e.d, id, "export Z=before")
	call := startGatedCall(t, e.d, id, e.d.RootfsPath(id), "export Z=after")
	ck := strings.TrimSpace(cklite(t, e.d, "checkpoint", "create", "-q", id))
	call.finish(t)
	if got := inSession(t, e.d, id, "echo $Z"); got != "after\n" {
		t.Fatalf("after the call the session printed %q", got)
	}
	inSession(t, e.d, id, "export Z=changed")
	cklite(t, e.d, "rollback", id, ck)
	// Rolled back mid-call: the call waits for the gate again, which the rollback took away.
	if _, err := os.Stat(call.gate); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the gate after the rollback: %v, want it gone with the files made after the checkpoint", err)
	}
	call.open(t)
	if got := inSession(t, e.d, id, "echo $Z"); got != "after\n" {
		t.Fatalf("after the rollback the session printed %q, want what the restored call left", got)
	}
}
