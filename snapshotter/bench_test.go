//go:build linux

package snapshotter

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"
	"github.com/containerd/continuity/fs"
)

// Run with `make bench-snapshotter`. Freeze and mount latencies are reported as p50 next to
// containerd's overlayfs snapshotter doing the same Commit+Prepare in the same run.

const mib = 1 << 20

// filePool makes n files of 1 MiB of random data once; uppers are filled with hard links to them,
// so an iteration's upper of any size costs no writes to set up.
func filePool(b *testing.B, n int) []string {
	b.Helper()
	dir := b.TempDir()
	files := make([]string, n)
	buf := make([]byte, mib)
	for i := range files {
		rand.Read(buf)
		files[i] = filepath.Join(dir, fmt.Sprintf("f%d", i))
		if err := os.WriteFile(files[i], buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return files
}

func BenchmarkFreeze(b *testing.B) {
	requireRoot(b)
	pool := filePool(b, 1024)
	for _, size := range []int{0, 100, 1024} { // MiB in the upper at each freeze
		for _, impl := range []struct {
			name string
			new  func(root string) (snapshots.Snapshotter, error)
		}{
			{"cklite", func(root string) (snapshots.Snapshotter, error) { return New(context.Background(), root) }},
			{"overlayfs", func(root string) (snapshots.Snapshotter, error) { return overlay.NewSnapshotter(root) }},
		} {
			b.Run(fmt.Sprintf("upper=%dMiB/%s", size, impl.name), func(b *testing.B) {
				sn, err := impl.new(b.TempDir())
				if err != nil {
					b.Fatal(err)
				}
				defer sn.Close()
				ctx := context.Background()
				if _, err := sn.Prepare(ctx, "k", ""); err != nil {
					b.Fatal(err)
				}
				var took []time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					upper := upperOf(b, sn, "k")
					for j, f := range pool[:size] {
						if err := os.Link(f, filepath.Join(upper, fmt.Sprintf("i%d-%d", i, j))); err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
					start := time.Now()
					name := fmt.Sprintf("f%d", i)
					if err := sn.Commit(ctx, name, "k"); err != nil {
						b.Fatal(err)
					}
					if _, err := sn.Prepare(ctx, "k", name); err != nil {
						b.Fatal(err)
					}
					took = append(took, time.Since(start))
				}
				reportP50(b, took)
			})
		}
	}
}

func reportP50(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
}

func BenchmarkMount(b *testing.B) {
	requireRoot(b)
	for _, depth := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			s, err := New(context.Background(), b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			parent := ""
			for i := range depth {
				key, name := fmt.Sprintf("k%d", i), fmt.Sprintf("l%d", i)
				if _, err := s.Prepare(ctx, key, parent); err != nil {
					b.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(upperOf(b, s, key), name), []byte(name), 0o644); err != nil {
					b.Fatal(err)
				}
				if err := s.Commit(ctx, name, key); err != nil {
					b.Fatal(err)
				}
				parent = name
			}
			mounts, err := s.Prepare(ctx, "top", parent)
			if err != nil {
				b.Fatal(err)
			}
			// Mount as a sandbox would once the background merges are done.
			snap := chainOf(b, s, "top")
			for _, job := range s.merges.due(snap) {
				if err := s.merges.ensure(job); err != nil {
					b.Fatal(err)
				}
			}
			if mounts, err = s.Mounts(ctx, "top"); err != nil {
				b.Fatal(err)
			}
			target := b.TempDir()
			var took []time.Duration
			for b.Loop() {
				start := time.Now()
				if err := mount.All(mounts, target); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
				if err := mount.UnmountAll(target, 0); err != nil {
					b.Fatal(err)
				}
			}
			reportP50(b, took)
			b.ReportMetric(float64(len(s.merges.plan(snap))), "lowerdirs")
		})
	}
}

// chainOf returns the layer ids below the active snapshot key, top first.
func chainOf(tb testing.TB, s *Snapshotter, key string) []string {
	tb.Helper()
	var ids []string
	err := s.ms.WithTransaction(context.Background(), false, func(ctx context.Context) error {
		snap, err := storage.GetSnapshot(ctx, key)
		ids = snap.ParentIDs
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return ids
}

// BenchmarkDiskUsage measures what 100 freezes of 1 MiB changes each cost on a 1 GiB base, with
// and without dedup. The changes are what an agent reinstalling packages writes: 1 MiB files
// extracted with their archived times, ten distinct ones written again and again. Run with
// -benchtime=1x: it measures space, not time.
func BenchmarkDiskUsage(b *testing.B) {
	requireRoot(b)
	payloads := filePool(b, 10)
	for _, tc := range []struct {
		name string
		opts []Opt
	}{{"plain", nil}, {"dedup", []Opt{WithDedup}}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				root := b.TempDir()
				s, err := New(context.Background(), root, tc.opts...)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if _, err := s.Prepare(ctx, "base", ""); err != nil {
					b.Fatal(err)
				}
				buf := make([]byte, mib)
				for i := range 1024 {
					rand.Read(buf)
					if err := os.WriteFile(filepath.Join(upperOf(b, s, "base"), fmt.Sprintf("base-%d", i)), buf, 0o644); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.Commit(ctx, "base-layer", "base"); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Prepare(ctx, "k", "base-layer"); err != nil {
					b.Fatal(err)
				}
				archived := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
				for i := range 100 {
					dst := filepath.Join(upperOf(b, s, "k"), fmt.Sprintf("pkg-%d", i%7))
					data, err := os.ReadFile(payloads[i%len(payloads)])
					if err == nil {
						err = os.WriteFile(dst, data, 0o644)
					}
					if err == nil {
						err = os.Chtimes(dst, archived, archived)
					}
					if err != nil {
						b.Fatal(err)
					}
					if err := s.Commit(ctx, fmt.Sprintf("freeze-%d", i), "k"); err != nil {
						b.Fatal(err)
					}
					if _, err := s.Prepare(ctx, "k", fmt.Sprintf("freeze-%d", i)); err != nil {
						b.Fatal(err)
					}
				}
				if s.dedup != nil {
					s.dedup.wait()
				}
				usage, err := fs.DiskUsage(ctx, root)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(usage.Size)/mib, "MiB-on-disk")
				s.Close()
			}
		})
	}
}
