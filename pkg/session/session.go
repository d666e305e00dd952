// Package session runs commands in long-lived shell sessions inside a container, for agents: a
// command's cwd, exported and shell variables, functions and background jobs stay for the next
// command of the same session, and across a checkpoint, a rollback (back to the session's state at
// the checkpoint) and a fork (each fork its own copy). The cklite CLI's exec command is built on
// it; pkg/client's Sessions gives one for a container.
//
// # Design
//
// A session is one shell (bash if the container has it, else sh) that an exec starts detached
// (setsid, stdio on /dev/null) and then ends: the kernel reparents the shell to the container's
// PID 1, so it is part of the process tree a checkpoint dumps and a restore brings back, with its
// memory. Between calls nothing outside the container holds it: no exec stays open, no pipe or
// socket to the shim that CRIU would have to treat as external. So it needs nothing of the shim's
// exec handling (a shim that keeps execs out of the dumped tree still checkpoints a session).
//
// Commands reach the shell through the container's filesystem, in a directory per session under
// Dir (/tmp/.cklite-sessions/NAME by default: in the container's rootfs, which the snapshotter
// freezes with every checkpoint, not a tmpfs). The shell holds the FIFO "in" open read-write and
// reads call ids from it; each call is one exec of ops.sh that writes the command to ID.cmd,
// makes the FIFOs ID.out and ID.err, starts a cat on each (stdout to the exec's stdout, stderr to
// its stderr), writes ID to "in", and exits with the status the shell writes to ID.status. The
// shell sources ID.cmd with stdin /dev/null and stdout/stderr on those FIFOs. FIFOs make the
// output streamed, binary-safe and of any size, with no copy on disk; the readers are open before
// the shell learns the id, so it never blocks opening them. The command is an argument of the
// exec (at most 128 KiB, the kernel's limit on one argument).
//
// A call's processes carry CKLITE_CALL=ID in their environment and a session's CKLITE_SESSION=NAME:
// a timeout SIGKILLs the processes of the call (found in /proc/*/environ), not the shell, which
// then writes the call's status and reads the next one; Close kills the shell and every process
// the session started. A command the shell runs itself (a loop of builtins) cannot be ended that
// way: after 5 s of trying the timeout kills the shell, ending the session (Run says so), so that
// a timeout always ends the call.
//
// Limits, as with any shell: `exit` ends the session (its status is still the call's; the next
// call starts a new session), `set -e` makes the first failure end it, and a background job that
// keeps the call's stdout or stderr open makes the call wait for it (redirect its output). The
// container needs sh, cat, mkfifo, tr, grep, sleep and, for the detachment, setsid (busybox and
// Debian have them all).
package session

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"regexp"
	"time"

	"github.com/containerd/errdefs"
)

//go:embed ops.sh
var opsScript string

//go:embed loop.sh
var loopScript string

// DefaultDir is where sessions keep their directories in the container.
const DefaultDir = "/tmp/.cklite-sessions"

// DefaultName is the session of calls that name none.
const DefaultName = "default"

// FailedStatus is the exit status of a call whose session failed (could not start, or ended
// without the command's status), as env(1) and timeout(1) use it for their own failures.
const FailedStatus = 125

// Execer runs args in the container to completion, copying its stdout and stderr, and returns
// its exit status. Cancelling ctx kills it.
type Execer interface {
	Exec(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error)
}

// Sessions are the sessions of one container.
type Sessions struct {
	ex  Execer
	dir string
	// killRounds bounds a timed-out call's kill: rounds of 50 ms, then the session ends.
	killRounds int
}

// New returns the sessions of the container ex executes in, kept under dir ("" for DefaultDir).
func New(ex Execer, dir string) *Sessions {
	if dir == "" {
		dir = DefaultDir
	}
	return &Sessions{ex: ex, dir: dir, killRounds: 100}
}

var validName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

func checkName(name string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("session name %q: want 1-64 of A-Z a-z 0-9 _ . -, not starting with . or -: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ops runs ops.sh with args, its output to stdout and stderr.
func (s *Sessions) ops(ctx context.Context, stdout, stderr io.Writer, args ...string) (int, error) {
	return s.ex.Exec(ctx, append([]string{"sh", "-c", opsScript, "cklite-session"}, args...), orDiscard(stdout), orDiscard(stderr))
}

// opsErr is ops for the operations that print little: a non-zero status is an error with what
// they printed on stderr.
func (s *Sessions) opsErr(ctx context.Context, stdout io.Writer, args ...string) error {
	var stderr limitedBuffer
	st, err := s.ops(ctx, stdout, &stderr, args...)
	if err != nil {
		return err
	}
	if st != 0 {
		return fmt.Errorf("session %s %s: exit status %d: %s", args[0], args[2:3], st, stderr.String())
	}
	return nil
}

// waitKill bounds the kill of a timed-out call (ops.sh kills the shell after killRounds rounds).
const waitKill = 30 * time.Second

// ErrSessionEnded is what Run returns (wrapped) when a timeout had to end the session: the
// command ran in the shell itself. The next call starts a new session.
var ErrSessionEnded = errors.New("the command ran in the session's shell itself: the timeout ended the session")

// endedStatus is ops.sh kill's status when it ended the session.
const endedStatus = 3
