//go:build linux

package capture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"golang.org/x/sys/unix"
)

// TestEstimate: the estimate made while the upper's writers run sees what the walk of the
// capture then sees, and stops past its limit of entries.
func TestEstimate(t *testing.T) {
	for _, tc := range []struct {
		name        string
		prev        bool // after a first capture
		change      func(t *testing.T, root string)
		maxEntries  int
		wantEntries int // -1: what the walk sees
	}{
		{name: "first capture", change: func(*testing.T, string) {}, wantEntries: -1},
		{name: "unchanged", prev: true, change: func(*testing.T, string) {}, wantEntries: -1},
		{name: "one file written", prev: true, change: func(t *testing.T, r string) { write(t, r, "work/big", string(make([]byte, 10000))) }, wantEntries: -1},
		{name: "past the limit", change: func(*testing.T, string) {}, maxEntries: 3, wantEntries: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			var prev *Record
			if tc.prev {
				prev = e.capture(nil, "cap1")
				age(prev)
			}
			tc.change(t, e.live)
			c, err := Open(e.ctx, e.sn, "live", "cap2", prev)
			must(t, err)
			est, err := c.Estimate(tc.maxEntries)
			must(t, err)
			must(t, c.Prepare(e.ctx, e.sn))
			defer c.Abort(e.ctx, e.sn)
			must(t, c.Walk())
			st := c.Stats()
			if tc.wantEntries >= 0 {
				if est.Entries != tc.wantEntries {
					t.Fatalf("estimate saw %d entries, want %d (it stops past %d)", est.Entries, tc.wantEntries, tc.maxEntries)
				}
				return
			}
			if est.Entries != st.Entries || est.Writes != st.Writes || est.Bytes != st.Bytes || est.Size != st.Size || est.Delta != st.Delta {
				t.Fatalf("estimate %+v, the capture's walk %+v", est, st)
			}
		})
	}
}

// TestOpenFromRecord: a capture after a record of the same key asks the snapshotter nothing
// before its Prepare.
func TestOpenFromRecord(t *testing.T) {
	e := newEnv(t)
	prev := e.capture(nil, "cap1")
	c, err := Open(e.ctx, noLookups{e.sn}, "live", "cap2", prev)
	must(t, err)
	must(t, c.Prepare(e.ctx, e.sn))
	defer c.Abort(e.ctx, e.sn)
	if c.Base() != "cap1" || !c.Stats().Delta {
		t.Fatalf("capture on %q (stats %+v), want a delta on cap1", c.Base(), c.Stats())
	}
}

// noLookups is a snapshotter that fails the lookups a capture with a record need not make.
type noLookups struct{ snapshots.Snapshotter }

var errLookup = errors.New("looked up")

func (noLookups) Stat(context.Context, string) (snapshots.Info, error) {
	return snapshots.Info{}, errLookup
}

func (noLookups) Mounts(context.Context, string) ([]mount.Mount, error) { return nil, errLookup }

// newTmpfsEnv is newEnv on a tmpfs of the test's own: no other writer changes its use.
func newTmpfsEnv(t *testing.T) *env {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root: a tmpfs, overlay mounts")
	}
	root := t.TempDir()
	must(t, unix.Mount("tmpfs", root, "tmpfs", 0, "size=64m"))
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })
	return newEnvAt(t, root)
}

// TestGrowth: after a capture, what was written through the live mount shows in the growth of
// the upper's filesystem (a tmpfs of the test's own: no other writer), which bounds the upper's
// entries and size; without a previous capture there is no growth to tell.
func TestGrowth(t *testing.T) {
	e := newTmpfsEnv(t)
	c, err := Open(e.ctx, e.sn, "live", "first", nil)
	must(t, err)
	if _, ok, err := c.Growth(); err != nil || ok {
		t.Fatalf("growth without a previous capture: ok %t, %v", ok, err)
	}
	first := e.capture(nil, "cap1")
	const n, size = 5, 1 << 20
	for i := range n {
		write(t, e.live, fmt.Sprint("work/big", i), strings.Repeat("x", size))
	}
	c, err = Open(e.ctx, e.sn, "live", "cap2", first)
	must(t, err)
	g, ok, err := c.Growth()
	must(t, err)
	if !ok || g.Bytes < n*size || g.Entries < int64(first.Len()+n) || g.Size < first.Size+n*size {
		t.Fatalf("growth %+v (ok %t) after %d files of %d bytes on a capture of %d entries, %d bytes", g, ok, n, size, first.Len(), first.Size)
	}
}

// TestGrowthLeavesOutTheCapture: the capture's own copy, written to the upper's filesystem, is no
// growth of the upper: a checkpoint after one that copied n files of 1 MiB, with nothing written
// in between, sees less than one of them (the snapshotter's metadata may have grown a page).
func TestGrowthLeavesOutTheCapture(t *testing.T) {
	e := newTmpfsEnv(t)
	const n, size = 5, 1 << 20
	for i := range n {
		write(t, e.live, fmt.Sprint("work/big", i), strings.Repeat("x", size))
	}
	first := e.capture(nil, "cap1")
	c, err := Open(e.ctx, e.sn, "live", "cap2", first)
	must(t, err)
	g, ok, err := c.Growth()
	must(t, err)
	if !ok || g.New >= n || g.Bytes >= size {
		t.Fatalf("growth %+v (ok %t) right after a capture of %d files of %d bytes: the capture's copy counted", g, ok, n, size)
	}
}

// TestEstimateWhileRenaming: the estimate runs while the upper's writers do; a file written aside
// and renamed over its name, as a counter or a probe writes its state every tick, is read in
// the directory and gone by its stat over and over. No estimate fails for it (each failed the
// first checkpoint after a rollback in the tree search, ~1 in 10 runs).
func TestEstimateWhileRenaming(t *testing.T) {
	e := newEnv(t)
	c, err := Open(e.ctx, e.sn, "live", "cap", nil)
	must(t, err)
	tmp, final := filepath.Join(e.live, "tmp", "count.new"), filepath.Join(e.live, "tmp", "count")
	must(t, os.MkdirAll(filepath.Dir(tmp), 0o755))
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := os.WriteFile(tmp, []byte(fmt.Sprint(i)), 0o644); err != nil {
				done <- err
				return
			}
			if err := os.Rename(tmp, final); err != nil {
				done <- err
				return
			}
		}
	}()
	for i := range 2000 {
		if _, err := c.Estimate(0); err != nil {
			close(stop)
			<-done
			t.Fatalf("estimate %d while a file is renamed over and over: %v", i+1, err)
		}
	}
	close(stop)
	must(t, <-done)
}
