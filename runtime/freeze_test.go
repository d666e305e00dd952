package runtime

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runc/libcontainer"
)

func TestRetryFreeze(t *testing.T) {
	unable := errors.New("unable to freeze")
	for _, tc := range []struct {
		name      string
		failures  int   // freeze fails this many times, then succeeds
		err       error // what it fails with
		timeout   time.Duration
		wantCalls int
		says      string // of the error; "" for success
	}{
		{name: "first try", failures: 0, err: unable, timeout: time.Second, wantCalls: 1},
		{name: "after three failures", failures: 3, err: unable, timeout: time.Second, wantCalls: 4},
		{name: "never", failures: 1 << 30, err: unable, timeout: 100 * time.Millisecond, says: "did not freeze in 100ms"},
		{name: "not running", failures: 1 << 30, err: libcontainer.ErrNotRunning, timeout: time.Second, wantCalls: 1, says: "not running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := retryFreeze(func() error {
				calls++
				if calls <= tc.failures {
					return tc.err
				}
				return nil
			}, tc.timeout)
			switch {
			case tc.says == "" && err != nil:
				t.Fatalf("retryFreeze: %v after %d calls", err, calls)
			case tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says)):
				t.Fatalf("retryFreeze: %v, want an error saying %q", err, tc.says)
			case tc.wantCalls != 0 && calls != tc.wantCalls:
				t.Fatalf("freeze called %d times, want %d", calls, tc.wantCalls)
			}
			if tc.name == "never" && !errdefs.IsUnavailable(err) {
				t.Fatalf("a cgroup that never froze: %v, want ErrUnavailable", err)
			}
		})
	}
}
