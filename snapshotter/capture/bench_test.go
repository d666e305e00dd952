//go:build linux

package capture

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkWalk measures the walk of an upper that changed in nothing since the previous capture:
// the cost of a capture per entry of the upper (docs/checkpoints.md, the switch rule).
func BenchmarkWalk(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			e := newBenchEnv(b, n, 1)
			prev := e.capture(nil, "first")
			age(prev)
			for b.Loop() {
				b.StopTimer()
				c, err := e.prepare("walk", prev)
				must(b, err)
				b.StartTimer()
				must(b, c.Walk())
				b.StopTimer()
				if c.Stats().Writes != 0 {
					b.Fatalf("an unchanged upper writes %+v", c.Stats())
				}
				c.Abort(e.ctx, e.sn)
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/entry")
		})
	}
}

// BenchmarkWrite measures the copy of what changed: many small files, or one large one.
func BenchmarkWrite(b *testing.B) {
	for _, tc := range []struct{ files, size int }{{1000, 4096}, {1, 64 << 20}} {
		b.Run(fmt.Sprintf("%dx%dKiB", tc.files, tc.size>>10), func(b *testing.B) {
			e := newBenchEnv(b, tc.files, tc.size)
			b.SetBytes(int64(tc.files * tc.size))
			for b.Loop() {
				b.StopTimer()
				c, err := e.prepare("write", nil)
				must(b, err)
				must(b, c.Walk())
				b.StartTimer()
				must(b, c.Write())
				b.StopTimer()
				c.Abort(e.ctx, e.sn)
				b.StartTimer()
			}
		})
	}
}

// newBenchEnv is newEnv with files files of size bytes in the live upper, 100 a directory.
func newBenchEnv(b *testing.B, files, size int) *env {
	e := newEnv(b)
	data := make([]byte, size)
	for i := range files {
		p := filepath.Join(e.live, "bench", fmt.Sprint(i/100), fmt.Sprint(i))
		if i%100 == 0 {
			must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		}
		must(b, os.WriteFile(p, data, 0o644))
	}
	return e
}
