//go:build linux

package capture

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/snapshotter"
	"github.com/cklite/cklite/snapshotter/freeze"
)

// TestCaptureDelta: after a first capture, each change of the live rootfs (through its overlay
// mount, so that overlayfs makes its own whiteouts and opaque directories) is captured as a delta
// on the first capture, and the merged view of the layers up to the delta equals the live view.
func TestCaptureDelta(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, root string)
		racy   bool // keep the first record racy (as if changed within racyWindow of it)
		writes int  // entries the delta writes, -1: not checked
	}{
		{name: "nothing", change: func(*testing.T, string) {}},
		{name: "append", change: func(t *testing.T, r string) { appendTo(t, r, "work/x", "more") }, writes: 1},
		{name: "create", change: func(t *testing.T, r string) { write(t, r, "work/new", "n") }, writes: -1},
		{name: "delete upper file", change: func(t *testing.T, r string) { rm(t, r, "work/y") }, writes: -1},
		{name: "delete lower file", change: func(t *testing.T, r string) { rm(t, r, "lowdir/a") }, writes: -1},
		{name: "recreate upper dir", change: func(t *testing.T, r string) {
			defer holdOpen(t, r, "updir")()
			rm(t, r, "updir")
			write(t, r, "updir/f3", "3")
		}, writes: -1},
		{name: "recreate lower dir", change: func(t *testing.T, r string) {
			rm(t, r, "lowdir")
			write(t, r, "lowdir/b", "new b")
		}, writes: -1},
		{name: "chmod", change: func(t *testing.T, r string) {
			chmod(t, r, "work/x", 0o600)
			chmod(t, r, "bin/tool", 0o700)
		}, writes: -1},
		{name: "symlinks", change: func(t *testing.T, r string) {
			symlink(t, r, "x", "work/ln")
			rm(t, r, "link")
			symlink(t, r, "bin/tool", "link")
		}, writes: -1},
		{name: "hard link", change: func(t *testing.T, r string) {
			must(t, os.Link(filepath.Join(r, "work/x"), filepath.Join(r, "work/hl")))
		}, writes: -1},
		{name: "dir becomes file", change: func(t *testing.T, r string) {
			rm(t, r, "work/deep")
			write(t, r, "work/deep", "now a file")
		}, writes: -1},
		{name: "file becomes dir", change: func(t *testing.T, r string) {
			rm(t, r, "work/x")
			write(t, r, "work/x/in", "inside")
		}, writes: -1},
		{name: "rename dir", change: func(t *testing.T, r string) {
			must(t, os.Rename(filepath.Join(r, "work/deep"), filepath.Join(r, "work/deep2")))
		}, writes: -1},
		{name: "xattr and fifo", change: func(t *testing.T, r string) {
			must(t, unix.Lsetxattr(filepath.Join(r, "work/x"), "user.k", []byte("v"), 0))
			must(t, unix.Mkfifo(filepath.Join(r, "work/p"), 0o640))
		}, writes: -1},
		{name: "racy same-size rewrite", racy: true, change: func(t *testing.T, r string) {
			write(t, r, "work/x", "XXXX")
		}, writes: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			first := e.capture(nil, "cap1")
			if !tc.racy {
				age(first)
			}
			before := tree(t, e.live)
			tc.change(t, e.live)
			p, second := e.captureOf(first, "cap2")
			if st := p.Stats(); !st.Delta || p.Base() != "cap1" {
				t.Fatalf("second capture: stats %+v on %q, want a delta on cap1", st, p.Base())
			}
			if tc.writes >= 0 && p.Stats().Writes != tc.writes {
				t.Fatalf("the delta writes %d entries (%v), want %d", p.Stats().Writes, p.ops, tc.writes)
			}
			if second.Len() != p.Stats().Entries {
				t.Fatalf("record of %d entries, the walk saw %d", second.Len(), p.Stats().Entries)
			}
			e.sameView(t, "cap2", tree(t, e.live))
			e.sameView(t, "cap1", before)
		})
	}
}

// TestCaptureWhole: without a usable record the whole upper goes on the snapshot's parent.
func TestCaptureWhole(t *testing.T) {
	for _, tc := range []struct {
		name string
		prev func(e *env) *Record
	}{
		{name: "first capture", prev: func(*env) *Record { return nil }},
		{name: "previous layer gone", prev: func(e *env) *Record {
			r := e.capture(nil, "gone")
			must(e.t, e.sn.Remove(e.ctx, "gone"))
			return r
		}},
		{name: "another upper", prev: func(e *env) *Record {
			// A record of another key's upper (a key keeps its upper: Open trusts the record of
			// the same key, the caller drops it when it switches the key's upper).
			r := e.capture(nil, "other")
			r.Key, r.Upper = "elsewhere", "/elsewhere"
			return r
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			prev := tc.prev(e)
			p, _ := e.captureOf(prev, "whole")
			if p.Stats().Delta || p.Base() != "base" || p.Stats().Writes != p.Stats().Entries {
				t.Fatalf("stats %+v on %q, want the whole upper on base", p.Stats(), p.Base())
			}
			e.sameView(t, "whole", tree(t, e.live))
		})
	}
}

// TestCaptureChain: captures stacked one on another, with changes between them, each show the
// live view as it was when it was taken.
func TestCaptureChain(t *testing.T) {
	e := newEnv(t)
	var rec *Record
	views := map[string]map[string]node{}
	for i := range 5 {
		name := fmt.Sprintf("cap%d", i)
		write(t, e.live, fmt.Sprintf("work/f%d", i), name)
		if i > 0 {
			rm(t, e.live, fmt.Sprintf("work/f%d", i-1))
			appendTo(t, e.live, "work/x", name)
		}
		rec = e.capture(rec, name)
		age(rec)
		views[name] = tree(t, e.live)
	}
	for name, want := range views {
		e.sameView(t, name, want)
	}
}

type env struct {
	t    testing.TB
	ctx  context.Context
	sn   snapshots.Snapshotter
	live string // the live overlay mount of snapshot "live" on "base"
}

// newEnv makes a snapshotter with a base layer, an active snapshot "live" on it mounted, and
// changes made through the mount: a file copied up, files and directories of the upper alone.
func newEnv(t testing.TB) *env { return newEnvAt(t, t.TempDir()) }

// newEnvAt is newEnv with the snapshotter's root at root.
func newEnvAt(t testing.TB, root string) *env {
	if os.Getuid() != 0 {
		t.Skip("needs root: overlay mounts and trusted.* attributes")
	}
	ctx := context.Background()
	sn, err := snapshotter.New(ctx, root)
	must(t, err)
	t.Cleanup(func() { sn.Close() })
	ms, err := sn.Prepare(ctx, "base-k", "")
	must(t, err)
	lower, err := freeze.UpperDir("base-k", ms)
	must(t, err)
	write(t, lower, "etc/conf", "conf")
	write(t, lower, "lowdir/a", "a")
	write(t, lower, "lowdir/b", "b")
	write(t, lower, "lowdir/sub/c", "c")
	write(t, lower, "bin/tool", "#!/bin/sh")
	chmod(t, lower, "bin/tool", 0o755)
	symlink(t, lower, "etc/conf", "link")
	must(t, sn.Commit(ctx, "base", "base-k"))
	ms, err = sn.Prepare(ctx, "live", "base")
	must(t, err)
	e := &env{t: t, ctx: ctx, sn: sn, live: t.TempDir()}
	must(t, mount.All(ms, e.live))
	t.Cleanup(func() { _ = mount.UnmountAll(e.live, 0) })
	appendTo(t, e.live, "etc/conf", " changed")
	write(t, e.live, "work/x", "xxxx")
	write(t, e.live, "work/y", "y")
	write(t, e.live, "work/deep/z", "z")
	write(t, e.live, "updir/f1", "1")
	write(t, e.live, "updir/f2", "2")
	return e
}

func (e *env) capture(prev *Record, name string) *Record {
	_, r := e.captureOf(prev, name)
	return r
}

// prepare opens and prepares the capture of "live" as name, after prev.
func (e *env) prepare(name string, prev *Record) (*Capture, error) {
	c, err := Open(e.ctx, e.sn, "live", name, prev)
	if err != nil {
		return nil, err
	}
	return c, c.Prepare(e.ctx, e.sn)
}

// captureOf captures "live" as name, after prev.
func (e *env) captureOf(prev *Record, name string) (*Capture, *Record) {
	c, err := e.prepare(name, prev)
	must(e.t, err)
	must(e.t, c.Walk())
	must(e.t, c.Write())
	r, err := c.Commit(e.ctx, e.sn, nil)
	must(e.t, err)
	return c, r
}

// sameView mounts a view of layer and compares it with want.
func (e *env) sameView(t *testing.T, layer string, want map[string]node) {
	t.Helper()
	ms, err := e.sn.View(e.ctx, "view-"+layer, layer)
	must(t, err)
	defer func() { must(t, e.sn.Remove(e.ctx, "view-"+layer)) }()
	dir := t.TempDir()
	must(t, mount.All(ms, dir))
	defer func() { must(t, mount.UnmountAll(dir, 0)) }()
	got := tree(t, dir)
	if reflect.DeepEqual(got, want) {
		return
	}
	for p, n := range want {
		if g, ok := got[p]; !ok || !reflect.DeepEqual(g, n) {
			t.Errorf("%s: %s is %+v, want %+v", layer, p, g, n)
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: %s is there (%+v), want it gone", layer, p, g)
		}
	}
}

// age makes a record look taken long before what follows: nothing in it is racy.
func age(r *Record) {
	for p, e := range r.entries {
		e.racy = false
		r.entries[p] = e
	}
}

// node is what a merged view shows of one path.
type node struct {
	Mode          uint32
	UID, GID      uint32
	Mtime         unix.Timespec
	Content, Link string
	Xattrs        map[string]string
}

func tree(t *testing.T, root string) map[string]node {
	t.Helper()
	out := map[string]node{}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := lstat(p)
		if err != nil {
			return err
		}
		n := node{Mode: st.Mode, UID: st.Uid, GID: st.Gid, Mtime: st.Mtim, Xattrs: map[string]string{}}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			n.Content = string(b)
		case unix.S_IFLNK:
			if n.Link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		names, err := listXattrs(p)
		if err != nil {
			return err
		}
		for _, name := range names {
			v, err := getXattr(p, name)
			if err != nil {
				return err
			}
			n.Xattrs[name] = string(bytes.TrimRight(v, "\x00"))
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = n
		return nil
	})
	must(t, err)
	return out
}

func write(t testing.TB, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(content), 0o644))
}

func appendTo(t testing.TB, root, rel, content string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(root, rel), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = f.WriteString(content)
	must(t, err)
	must(t, f.Close())
}

func rm(t testing.TB, root, rel string) { t.Helper(); must(t, os.RemoveAll(filepath.Join(root, rel))) }

func chmod(t testing.TB, root, rel string, mode os.FileMode) {
	t.Helper()
	must(t, os.Chmod(filepath.Join(root, rel), mode))
}

func symlink(t testing.TB, root, target, rel string) {
	t.Helper()
	must(t, os.Symlink(target, filepath.Join(root, rel)))
}

// holdOpen keeps a directory's inode alive until the returned func: a directory made again
// meanwhile gets another inode number.
func holdOpen(t *testing.T, root, rel string) func() {
	t.Helper()
	f, err := os.Open(filepath.Join(root, rel))
	must(t, err)
	return func() { f.Close() }
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestCaptureAbort: an aborted capture leaves no snapshot.
func TestCaptureAbort(t *testing.T) {
	e := newEnv(t)
	c, err := e.prepare("aborted", nil)
	must(t, err)
	must(t, c.Walk())
	c.Abort(e.ctx, e.sn)
	for _, name := range []string{"cklite/capturing/aborted", "aborted"} {
		if _, err := e.sn.Stat(e.ctx, name); !errdefs.IsNotFound(err) {
			t.Fatalf("after Abort, snapshot %s: %v, want not found", name, err)
		}
	}
}

// TestCaptureSkipsCRIUTemporary: the directories CRIU makes in the task's root or /tmp during
// its dump (criuTemporary), with whatever is mounted below them, are left out of a capture; a
// name that only looks like one is not.
func TestCaptureSkipsCRIUTemporary(t *testing.T) {
	e := newEnv(t)
	write(t, e.live, "tmp/keep", "k")
	write(t, e.live, "tmp/cr-tmpfs.long-name/kept", "k")
	write(t, e.live, "work/cr-tmpfs.Ab12Cd/kept", "k")
	write(t, e.live, "cr-tmpfs.file12", "a file")
	write(t, e.live, "tmp/cr-tmpfs.Qk3bg8/null", "what a bind mount of /dev shows")
	write(t, e.live, "cr-tmpfs.x1Y2z3/shm/s", "s")
	want := tree(t, e.live)
	for _, rel := range []string{"tmp/cr-tmpfs.Qk3bg8", "tmp/cr-tmpfs.Qk3bg8/null", "cr-tmpfs.x1Y2z3", "cr-tmpfs.x1Y2z3/shm", "cr-tmpfs.x1Y2z3/shm/s"} {
		delete(want, rel)
	}
	c, _ := e.captureOf(nil, "skip")
	e.sameView(t, "skip", want)
	if st := c.Stats(); st.Writes != st.Entries {
		t.Fatalf("stats %+v: want the whole upper written", st)
	}
}
