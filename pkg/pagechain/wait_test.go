package pagechain

import (
	"context"
	"testing"
	"time"
)

// TestWaitReport: a report already there or written while waiting ends the wait at once (the
// rename wakes it); none by the deadline, or a cancelled context, ends it without one.
func TestWaitReport(t *testing.T) {
	for _, tc := range []struct {
		name     string
		before   bool // the report is written before the wait
		during   bool // the report is written while waiting
		deadline time.Duration
		cancel   bool
		want     bool
	}{
		{name: "there already", before: true, deadline: time.Minute, want: true},
		{name: "written while waiting", during: true, deadline: time.Minute, want: true},
		{name: "deadline passed", deadline: -time.Second},
		{name: "cancelled", deadline: time.Minute, cancel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.before {
				if err := WriteReport(dir, Report{Skipped: "test"}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			written := make(chan error, 1)
			if tc.during {
				go func() { written <- WriteReport(dir, Report{Parent: "p"}) }()
			}
			ok, err := WaitReport(ctx, dir, time.Now().Add(tc.deadline))
			if ok != tc.want || (tc.cancel && err == nil) || (!tc.cancel && err != nil) {
				t.Fatalf("WaitReport: %v, %v; want %v", ok, err, tc.want)
			}
			if tc.during {
				if err := <-written; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
