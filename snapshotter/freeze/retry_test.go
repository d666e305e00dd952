package freeze

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// TestRetryUnavailable: a switch is tried again while containerd or the snapshotter is
// unavailable (restarting), and only then.
func TestRetryUnavailable(t *testing.T) {
	unavailable := fmt.Errorf("dial containerd: connection refused: %w", errdefs.ErrUnavailable)
	for _, tc := range []struct {
		name      string
		errs      []error // what the calls return, in turn; the last one repeats
		wantCalls int
		wantErr   error
	}{
		{"succeeds", []error{nil}, 1, nil},
		{"back after two failures", []error{unavailable, unavailable, nil}, 3, nil},
		{"other errors are final", []error{errdefs.ErrNotFound}, 1, errdefs.ErrNotFound},
		{"unavailable then final", []error{unavailable, errdefs.ErrFailedPrecondition}, 2, errdefs.ErrFailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := RetryUnavailable(context.Background(), time.Minute, func() error {
				calls++
				return tc.errs[min(calls, len(tc.errs))-1]
			})
			if calls != tc.wantCalls || !errors.Is(err, tc.wantErr) && err != tc.wantErr {
				t.Fatalf("%d calls, error %v; want %d calls, error %v", calls, err, tc.wantCalls, tc.wantErr)
			}
		})
	}
}

// TestRetryUnavailableGivesUp: a daemon that does not come back fails the switch after the limit.
func TestRetryUnavailableGivesUp(t *testing.T) {
	calls := 0
	err := RetryUnavailable(context.Background(), 300*time.Millisecond, func() error {
		calls++
		return errdefs.ErrUnavailable
	})
	if !errdefs.IsUnavailable(err) || calls < 2 {
		t.Fatalf("%d calls, error %v; want several calls, then ErrUnavailable", calls, err)
	}
}
