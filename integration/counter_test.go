package integration

import (
	"context"
	"testing"
	"time"

	"github.com/cklite/cklite/integration/workload"
)

// counter is workload.Counter failing the test on error.
type counter struct{ workload.Counter }

func newCounter(rootfs string) counter { return counter{workload.Counter{Rootfs: rootfs}} }

func (c counter) advance(t *testing.T, n int) workload.Count {
	t.Helper()
	x, err := c.Advance(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func (c counter) expectRestored(t *testing.T, at workload.Count) {
	t.Helper()
	if err := c.ExpectRestored(context.Background(), at); err != nil {
		t.Fatal(err)
	}
}

func logTiming(t *testing.T, what string, start time.Time) {
	t.Helper()
	t.Logf("timing: %-55s %8.1f ms", what, float64(time.Since(start).Microseconds())/1000)
}
