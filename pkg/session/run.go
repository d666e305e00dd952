package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// RunOptions are a call's output and bound.
type RunOptions struct {
	Stdout, Stderr io.Writer     // nil discards
	Timeout        time.Duration // 0: none
}

// Result is how a call ended.
type Result struct {
	Status   int  // the command's exit status (FailedStatus if the session failed)
	TimedOut bool // the timeout (or ctx) ended it: its processes were killed
}

// Run runs command in session name (started on first use) and streams its stdout and stderr to
// opts' writers. The command runs in the session's shell itself, as if typed there. When
// opts.Timeout passes or ctx is done, the call's processes are killed, the session lives on, and
// Run returns when the shell has ended the call (Result.TimedOut, and ctx's error if ctx ended);
// a command the shell runs itself is ended with the session (ErrSessionEnded).
func (s *Sessions) Run(ctx context.Context, name, command string, opts RunOptions) (Result, error) {
	if err := checkName(name); err != nil {
		return Result{}, err
	}
	if len(command) >= 128<<10 {
		return Result{}, fmt.Errorf("command of %d bytes: at most 128 KiB: %w", len(command), errdefs.ErrInvalidArgument)
	}
	stdout, stderr := orDiscard(opts.Stdout), orDiscard(opts.Stderr)
	id := callID()
	// The call's exec outlives ctx: it must end by the call's end, not be killed mid-output.
	callCtx, cancelCall := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelCall()
	type exit struct {
		status int
		err    error
	}
	done := make(chan exit, 1)
	go func() {
		st, err := s.ops(callCtx, stdout, stderr, "run", s.dir, name, id, loopScript, command)
		done <- exit{st, err}
	}()
	var timeout <-chan time.Time
	if opts.Timeout > 0 {
		timer := time.NewTimer(opts.Timeout)
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case e := <-done:
		return Result{Status: e.status}, e.err
	case <-timeout:
	case <-ctx.Done():
	}
	killErr := s.kill(ctx, name, id)
	if killErr != nil && !errors.Is(killErr, ErrSessionEnded) {
		log.G(ctx).WithError(killErr).Warnf("session %s: call %s not ended: killing its exec", name, id)
		cancelCall()
	}
	e := <-done
	res := Result{Status: e.status, TimedOut: true}
	if killErr != nil {
		return res, fmt.Errorf("session %s: %w", name, killErr)
	}
	return res, ctx.Err()
}

// kill kills the processes of call id until the shell has ended the call, or ends the session.
func (s *Sessions) kill(ctx context.Context, name, id string) error {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), waitKill)
	defer cancel()
	var stderr limitedBuffer
	st, err := s.ops(kctx, nil, &stderr, "kill", s.dir, name, id, strconv.Itoa(s.killRounds))
	switch {
	case err != nil:
		return fmt.Errorf("kill call %s: %w", id, err)
	case st == endedStatus:
		return ErrSessionEnded
	case st != 0:
		return fmt.Errorf("kill call %s: exit status %d: %s", id, st, stderr.String())
	}
	return nil
}

// callID is a fresh call id: unique within a session, forks included (their shells share the
// parent's history, not its future calls).
func callID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
