package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestRestoreWatchdogCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lim     RestoreLimits
		age     time.Duration // since the restore started
		logSize int           // bytes of restore.log; -1: none
		want    func(error) bool
	}{
		{name: "no limits", age: time.Hour, logSize: 1 << 20},
		{name: "within both", lim: RestoreLimits{Timeout: time.Minute, LogLimit: 100}, age: time.Second, logSize: 100},
		{name: "no log yet", lim: RestoreLimits{LogLimit: 100}, logSize: -1},
		{name: "past the time", lim: RestoreLimits{Timeout: time.Second}, age: 2 * time.Second, logSize: -1,
			want: func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }},
		{name: "past the log", lim: RestoreLimits{LogLimit: 100}, logSize: 101, want: errdefs.IsResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "restore.log")
			if tc.logSize >= 0 {
				if err := os.WriteFile(log, make([]byte, tc.logSize), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			w := &restoreWatchdog{log: log, lim: tc.lim, start: time.Now().Add(-tc.age)}
			w.check()
			switch {
			case tc.want == nil && w.cause != nil:
				t.Fatalf("fired: %v", w.cause)
			case tc.want != nil && (w.cause == nil || !tc.want(w.cause)):
				t.Fatalf("cause %v, want another", w.cause)
			}
			if fi, err := os.Stat(log); tc.lim.LogLimit > 0 && err == nil && fi.Size() > tc.lim.LogLimit {
				t.Fatalf("restore.log left at %d bytes, past its limit %d", fi.Size(), tc.lim.LogLimit)
			}
		})
	}
}
