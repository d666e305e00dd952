package freeze

import (
	"context"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// RetryLimit bounds how long a switch or a freeze waits for containerd or the snapshotter to come
// back: a restart takes seconds, and the in-place cycle has already ended the task's processes,
// which only a finished switch or freeze lets it restore.
const RetryLimit = 30 * time.Second

// RetryUnavailable runs op until it succeeds, fails otherwise than with ErrUnavailable (containerd
// or the snapshotter not answering: restarting after a crash), or limit has passed. A switch may
// run again after any failure (Switch); each step of a freeze is retried on its own (Rootfs).
func RetryUnavailable(ctx context.Context, limit time.Duration, op func() error) error {
	deadline := time.Now().Add(limit)
	wait := 50 * time.Millisecond
	for {
		err := op()
		if err == nil || !errdefs.IsUnavailable(err) || time.Now().Add(wait).After(deadline) {
			return err
		}
		log.G(ctx).WithError(err).Warn("containerd or the snapshotter does not answer: trying again")
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}
