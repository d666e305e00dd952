package diff

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/diff"
)

// BenchmarkCompare diffs an active snapshot that changed one file on top of
// a 10,000-file, 200 MB base: the fast path walks the one-file upperdir,
// walking both whole trees.
func BenchmarkCompare(b *testing.B) {
	e := newEnv(b)
	data := make([]byte, 20<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	e.commit(b, "base", "", func(dir string) {
		for i := range 10000 {
			name := filepath.Join(dir, fmt.Sprintf("d%03d", i/100), fmt.Sprintf("f%04d", i))
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(name, data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	})
	lower, upper := e.active(b, "active", "base", func(dir string) {
		if err := os.WriteFile(filepath.Join(dir, "d042", "f4200"), []byte("changed"), 0o644); err != nil {
			b.Fatal(err)
		}
	})
	for _, bc := range []struct {
		name string
		d    diff.Comparer
	}{
		{"fast", e.fast},
		{"walking", e.walking},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := bc.d.Compare(context.Background(), lower, upper); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
