package runtime

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runc/libcontainer"
)

// freezeTimeout bounds how long Pause keeps trying to freeze the container's cgroup.
const freezeTimeout = 10 * time.Second

// A cgroup v1 freeze fails ("unable to freeze") when the cgroup stays FREEZING through the
// freezer's own ~1000 attempts: tasks forking fast or sleeping uninterruptibly on a machine busy
// with other dumps (2 of 32 concurrent checkpoints here, issue 16 item 8). The freezer thaws
// again when it gives up, so trying again later is safe; runc's callers retry the same way.
// Pause retries with a growing pause in between until freezeTimeout, then fails naming why.

// retryFreeze calls freeze until it succeeds, fails for a reason a retry cannot change, or
// timeout has passed.
func retryFreeze(freeze func() error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	wait := 5 * time.Millisecond
	tries := 0
	for {
		err := freeze()
		tries++
		if err == nil || !retryable(err) {
			return err
		}
		if time.Now().Add(wait).After(deadline) {
			return fmt.Errorf("the container's cgroup did not freeze in %s (%d tries; its tasks keep it FREEZING: forking fast, or in uninterruptible sleep): %w: %w",
				timeout, tries, err, errdefs.ErrUnavailable)
		}
		time.Sleep(wait)
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// retryable tells a freezer that gave up from a container in the wrong state or gone.
func retryable(err error) bool {
	for _, final := range []error{libcontainer.ErrNotRunning, libcontainer.ErrPaused, libcontainer.ErrNotExist, os.ErrNotExist} {
		if errors.Is(err, final) {
			return false
		}
	}
	return true
}
