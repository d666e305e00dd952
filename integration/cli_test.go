package integration

// The TestCLI tests drive the cklite CLI (bin/cklite) against a private containerd with the cklite
// runtime and snapshotter, on checkpoints the shim really took, and check what it prints against
// what containerd's leases and snapshot API say.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/docker/go-units"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/pkg/checkpoint"
	ckclient "github.com/cklite/cklite/pkg/client"
)

// cklite runs the cklite CLI against d and fails the test if it fails.
func cklite(t *testing.T, d *harness.Daemon, args ...string) string {
	t.Helper()
	out, err := d.Cklite(context.Background(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ckliteFails runs the cklite CLI against d, expecting it to exit with status 1 (failed) and an
// error message naming want; it returns what cklite printed on stdout.
func ckliteFails(t *testing.T, d *harness.Daemon, want string, args ...string) string {
	t.Helper()
	return ckliteExits(t, d, 1, want, args...)
}

// ckliteMisuse is ckliteFails for a wrong command line: exit status 2.
func ckliteMisuse(t *testing.T, d *harness.Daemon, want string, args ...string) string {
	t.Helper()
	return ckliteExits(t, d, 2, want, args...)
}

func ckliteExits(t *testing.T, d *harness.Daemon, code int, want string, args ...string) string {
	t.Helper()
	out, err := d.Cklite(context.Background(), args...)
	var exit *exec.ExitError
	switch {
	case err == nil:
		t.Fatalf("cklite %s succeeded, printing %q; want it to fail naming %q", strings.Join(args, " "), out, want)
	case !errors.As(err, &exit):
		t.Fatalf("cklite %s did not run: %v", strings.Join(args, " "), err)
	case exit.ExitCode() != code:
		t.Fatalf("cklite %s exited with %d, want %d: %v", strings.Join(args, " "), exit.ExitCode(), code, err)
	case !strings.Contains(err.Error(), want):
		t.Fatalf("cklite %s failed without naming %q: %v", strings.Join(args, " "), want, err)
	}
	t.Logf("refused as expected: %v", err)
	return out
}

// inspected is a checkpoint as `cklite checkpoint inspect` prints it.
type inspected struct {
	checkpoint.Meta
	ImagePath  string `json:"imagePath"`
	Filesystem *struct {
		Bytes  int64 `json:"bytes"`
		Inodes int64 `json:"inodes"`
	} `json:"filesystem"`
}

// lsRows returns the rows of `cklite checkpoint ls` below its header.
func lsRows(t *testing.T, out string) []string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "CHECKPOINT ") {
		t.Fatalf("checkpoint ls printed no header:\n%s", out)
	}
	return lines[1:]
}

// backendHas reports whether cklite-snapshotter itself, asked on its own socket, still holds the
// snapshot containerd names name (its backend keys are <namespace>/<sequence>/<name>).
func backendHas(t *testing.T, d *harness.Daemon, name string) bool {
	t.Helper()
	sn, closeConn := dialSnapshotter(t, d.SnapshotterAddress)
	defer closeConn()
	found := false
	err := sn.Walk(context.Background(), func(_ context.Context, info snapshots.Info) error {
		found = found || strings.HasSuffix(info.Name, "/"+name)
		return nil
	})
	if err != nil {
		t.Fatalf("walking cklite-snapshotter's snapshots: %v", err)
	}
	return found
}

// TestCLICheckpoints builds a tree of real checkpoints (A; B on A; rollback to A; C on A) and
// checks `cklite checkpoint ls`, `inspect` by id prefix, errors for unknown ids, and `rm`: a
// removed checkpoint's lease goes, and its frozen layer with it unless another checkpoint's layer
// or a container's rootfs is stacked on it.
func TestCLICheckpoints(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "tree")
	aDir, a, _ := e.markedCheckpoint(t, task, cnt, "A")
	changeMarks(t, cnt.Rootfs, "A")
	bDir, b, _ := e.markedCheckpoint(t, task, cnt, "B")
	task = e.rollback(t, c, aDir)
	changeMarks(t, cnt.Rootfs, "A")
	cDir, cc, cAt := e.markedCheckpoint(t, task, cnt, "C")
	e.expectParent(t, b, a)
	e.expectParent(t, cc, a)

	t.Run("ls", func(t *testing.T) {
		out := cklite(t, e.d, "checkpoint", "ls")
		t.Logf("cklite checkpoint ls:\n%s", out)
		rows := lsRows(t, out)
		want := []struct {
			tree string // what precedes the id
			m    checkpoint.Meta
			now  string // the NOW column: C is the state the container runs on
		}{{"", a, ""}, {"├─ ", b, ""}, {"└─ ", cc, "◀ tree"}}
		if len(rows) != len(want) {
			t.Fatalf("checkpoint ls printed %d rows, want %d:\n%s", len(rows), len(want), strings.Join(rows, "\n"))
		}
		for i, w := range want {
			usage, err := e.sn.Usage(e.ctx, w.m.Frozen)
			if err != nil {
				t.Fatal(err)
			}
			row := rows[i]
			if !strings.HasPrefix(row, w.tree+w.m.ID+" ") {
				t.Fatalf("row %d does not start with %q (parent first, children oldest first, drawn as a tree):\n%s", i, w.tree+w.m.ID, row)
			}
			if n := utf8.RuneCountInString(row); n > 100 {
				t.Fatalf("row %d is %d columns wide:\n%s", i, n, row)
			}
			// CHECKPOINT NAME CONTAINER AGE MEMORY STORED FILES [NOW]; STORED is MEMORY: a
			// directory the client names keeps its full dump (only cklite's own are deduplicated).
			fields := strings.Fields(strings.TrimPrefix(row, w.tree))
			memory := units.HumanSizeWithPrecision(float64(w.m.MemoryBytes), 3)
			wantFields := []string{w.m.ID, "-", "tree", fields[3], memory, memory,
				units.HumanSizeWithPrecision(float64(usage.Size), 3)}
			if w.now != "" {
				wantFields = append(wantFields, strings.Fields(w.now)...)
			}
			if !slices.Equal(fields, wantFields) {
				t.Fatalf("row %d: %q, want %q:\n%s", i, fields, wantFields, row)
			}
		}
		ids := strings.Fields(cklite(t, e.d, "checkpoint", "ls", "--quiet"))
		if want := []string{a.ID, b.ID, cc.ID}; !slices.Equal(ids, want) {
			t.Fatalf("checkpoint ls --quiet printed %v, want %v (oldest first)", ids, want)
		}
	})

	t.Run("inspect by id prefix", func(t *testing.T) {
		var got []inspected
		out := cklite(t, e.d, "checkpoint", "inspect", cc.ID[:8], a.ID)
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("checkpoint inspect printed no JSON list: %v\n%s", err, out)
		}
		if len(got) != 2 {
			t.Fatalf("checkpoint inspect of two printed %d:\n%s", len(got), out)
		}
		for i, w := range []struct {
			m   checkpoint.Meta
			dir string
		}{{cc, cDir}, {a, aDir}} {
			g := got[i]
			if !g.Created.Equal(w.m.Created) {
				t.Fatalf("inspect says checkpoint %s was created %s, %s says %s", w.m.ID, g.Created, checkpoint.MetaFile, w.m.Created)
			}
			// Everything cklite.json says, host and version included, comes from the lease.
			g.Created, w.m.Created = time.Time{}, time.Time{}
			if !reflect.DeepEqual(g.Meta, w.m) {
				t.Fatalf("inspect %s printed\n%+v\n%s says\n%+v", w.m.ID, g.Meta, checkpoint.MetaFile, w.m)
			}
			if g.ImagePath != w.dir {
				t.Fatalf("inspect %s: image path %q, want %q", w.m.ID, g.ImagePath, w.dir)
			}
			usage, err := e.sn.Usage(e.ctx, w.m.Frozen)
			if err != nil {
				t.Fatal(err)
			}
			if g.Filesystem == nil || g.Filesystem.Bytes != usage.Size || g.Filesystem.Bytes == 0 {
				t.Fatalf("inspect %s: filesystem %+v, the snapshotter says %+v for %s", w.m.ID, g.Filesystem, usage, w.m.Frozen)
			}
		}
	})

	t.Run("unknown ids", func(t *testing.T) {
		for _, tc := range []struct {
			name       string
			args       []string
			want       string
			wantStdout string // checkpoints an unknown id did not stop
			exit       int    // 2: a wrong command line
		}{
			{"inspect", []string{"checkpoint", "inspect", "zzzzzz"}, `no checkpoint "zzzzzz"`, "", 1},
			{"inspect a known and an unknown", []string{"checkpoint", "inspect", "zzzzzz", a.ID}, "1 of 2 checkpoints failed", a.ID, 1},
			{"rm", []string{"checkpoint", "rm", "--gc", "zzzzzz"}, `no checkpoint "zzzzzz"`, "", 1},
			{"rm without an id", []string{"checkpoint", "rm"}, "no checkpoint id given", "", 2},
			{"fork", []string{"fork", "zzzzzz"}, `no checkpoint "zzzzzz"`, "", 1},
		} {
			t.Run(tc.name, func(t *testing.T) {
				out := ckliteExits(t, e.d, tc.exit, tc.want, tc.args...)
				if (tc.wantStdout == "") != (out == "") || !strings.Contains(out, tc.wantStdout) {
					t.Fatalf("printed %q, want %q", out, tc.wantStdout)
				}
			})
		}
		if ids := recordIDs(e.records(t)); !slices.Equal(ids, []string{a.ID, b.ID, cc.ID}) {
			t.Fatalf("after the failed commands the checkpoints are %v, want the three", ids)
		}
	})

	t.Run("rm a leaf frees its layer", func(t *testing.T) {
		// Since the rollback, nothing is stacked on B's layer: its lease alone holds it.
		if !backendHas(t, e.d, b.Frozen) {
			t.Fatalf("cklite-snapshotter does not hold B's frozen layer %s before rm", b.Frozen)
		}
		if out := cklite(t, e.d, "checkpoint", "rm", "--gc", b.ID[:8]); out != b.ID+"\n" {
			t.Fatalf("checkpoint rm printed %q, want the full id", out)
		}
		if ls, err := e.lm.List(e.ctx, "id=="+checkpoint.LeaseID(b.ID)); err != nil || len(ls) != 0 {
			t.Fatalf("lease %s after rm: %v (%v)", checkpoint.LeaseID(b.ID), ls, err)
		}
		if _, err := e.sn.Stat(e.ctx, b.Frozen); !errdefs.IsNotFound(err) {
			t.Fatalf("containerd still has B's frozen layer after rm --gc (stat: %v)", err)
		}
		if backendHas(t, e.d, b.Frozen) {
			t.Fatalf("cklite-snapshotter still holds B's frozen layer %s after rm --gc", b.Frozen)
		}
		if _, err := os.Stat(bDir); err != nil {
			t.Fatalf("rm without --image removed the image directory: %v", err)
		}
	})

	t.Run("rm a parent keeps its layer for its child", func(t *testing.T) {
		cklite(t, e.d, "checkpoint", "rm", "--gc", "--image", a.ID)
		if ls, err := e.lm.List(e.ctx, "id=="+checkpoint.LeaseID(a.ID)); err != nil || len(ls) != 0 {
			t.Fatalf("lease %s after rm: %v (%v)", checkpoint.LeaseID(a.ID), ls, err)
		}
		if _, err := os.Stat(aDir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("rm --image left the image directory %s: %v", aDir, err)
		}
		if _, err := e.sn.Stat(e.ctx, a.Frozen); err != nil {
			t.Fatalf("A's frozen layer, which C's is stacked on, was collected: %v", err)
		}
		rows := lsRows(t, cklite(t, e.d, "checkpoint", "ls"))
		if want := cc.ID + " (parent gone)"; len(rows) != 1 || !strings.HasPrefix(rows[0], want+" ") {
			t.Fatalf("after removing A and B, checkpoint ls printed\n%s\nwant one row for %s", strings.Join(rows, "\n"), want)
		}
		// C is whole: its layer and the one below it restore.
		e.rollback(t, c, cDir)
		expectRolledBack(t, cnt, cAt, "C")
	})
}

// forkLineRE is the line `cklite fork` prints as each fork runs.
var forkLineRE = regexp.MustCompile(`^  (\S+) \(([0-9a-f]{12})\) running, restored in (\S+)$`)

// TestCLIFork forks a running counter's checkpoint into three containers with `cklite fork -n 3`:
// each counts on from the checkpointed value with the same token, holds the checkpoint's files on
// a rootfs snapshot of its own stacked on the shared frozen layer, and runs in its own cgroup and
// network namespace next to the original. A checkpoint of a fork is a child of the one it was
// forked from; refused forks leave nothing behind.
func TestCLIFork(t *testing.T) {
	e := newCkEnv(t)
	_, task, cnt := e.startCounter(t, "web")
	dir, m, at := e.markedCheckpoint(t, task, cnt, "base")
	logs := filepath.Join(e.d.Dir, "fork-logs")

	start := time.Now()
	out := cklite(t, e.d, "fork", "-n", "3", "--log-dir", logs, m.ID[:8])
	logTiming(t, "cklite fork -n 3 (the whole command)", start)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("cklite fork -n 3 printed %d lines, want 5 (start, one a fork, total):\n%s", len(lines), out)
	}
	if want := fmt.Sprintf("forking checkpoint %s into 3 forks (images in %s)", m.ID, dir); lines[0] != want {
		t.Fatalf("cklite fork printed %q first, want %q", lines[0], want)
	}
	// Forks start several at once, so their lines come in the order they end up running.
	var names []string
	for i, l := range lines[1:4] {
		sub := forkLineRE.FindStringSubmatch(l)
		if sub == nil {
			t.Fatalf("progress line %d is %q, want a fork running", i+1, l)
		}
		t.Logf("timing: fork %s restored in %s", sub[1], sub[3])
		names = append(names, sub[1])
	}
	slices.Sort(names)
	if want := []string{"web-fork-1", "web-fork-2", "web-fork-3"}; !slices.Equal(names, want) {
		t.Fatalf("progress lines name %v, want %v", names, want)
	}
	ids := forkIDsByName(t, e, names)
	if !regexp.MustCompile(`^3 forks running in \S+ \(\S+ each on average\)$`).MatchString(lines[4]) {
		t.Fatalf("cklite fork's last line is %q, want the total", lines[4])
	}
	t.Logf("cklite fork said: %s", lines[4])

	keys := map[string]string{}
	procs := map[string]string{} // a task's cgroups and network namespace, by container
	procs["web"] = procIdentity(t, e, "web")
	for _, id := range ids {
		f, err := e.d.Client().LoadContainer(e.ctx, id)
		if err != nil {
			t.Fatalf("fork %s: %v", id, err)
		}
		info, err := f.Info(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if other, ok := keys[info.SnapshotKey]; ok || info.Snapshotter != ckliteSnapshotter {
			t.Fatalf("fork %s has rootfs snapshot %s/%s (also %q's)", id, info.Snapshotter, info.SnapshotKey, other)
		}
		keys[info.SnapshotKey] = id
		sinfo, err := e.sn.Stat(e.ctx, info.SnapshotKey)
		if err != nil {
			t.Fatal(err)
		}
		if sinfo.Kind != snapshots.KindActive || sinfo.Parent != m.Frozen {
			t.Fatalf("fork %s's rootfs snapshot is %s on %q, want active on the checkpoint's frozen layer %s", id, sinfo.Kind, sinfo.Parent, m.Frozen)
		}
		ft, err := f.Task(e.ctx, nil)
		if err != nil {
			t.Fatalf("task of fork %s: %v", id, err)
		}
		e.expectStatus(t, ft, client.Running, "after cklite fork")
		procs[id] = procIdentity(t, e, id)
		if _, err := os.Stat(filepath.Join(logs, id+".log")); err != nil {
			t.Fatalf("fork %s's log: %v", id, err)
		}
	}
	for id, p := range procs {
		for other, q := range procs {
			if id < other && p == q {
				t.Fatalf("%s and %s share their cgroups and network namespace:\n%s", id, other, p)
			}
		}
	}
	for _, id := range ids {
		fc := newCounter(e.d.RootfsPath(id))
		expectRolledBack(t, fc, at, "base")
		if err := os.WriteFile(filepath.Join(fc.Rootfs, "mine"), []byte(id), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range append([]string{"web"}, ids...) {
		want := id // the original has none
		if id == "web" {
			want = ""
		}
		if data, _ := os.ReadFile(filepath.Join(e.d.RootfsPath(id), "mine")); string(data) != want {
			t.Fatalf("%s's /mine holds %q, want %q: each fork's writes are its own", id, data, want)
		}
	}
	expectContinues(t, cnt, at)

	var childDir string // the images of the fork's checkpoint
	t.Run("a checkpoint of a fork is a child", func(t *testing.T) {
		ft, err := e.d.Client().LoadContainer(e.ctx, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		fTask, err := ft.Task(e.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var child checkpoint.Meta
		childDir, child, _ = e.markedCheckpoint(t, fTask, newCounter(e.d.RootfsPath(ids[0])), "child")
		rows := lsRows(t, cklite(t, e.d, "checkpoint", "ls"))
		// CONTAINER is the fork's nerdctl name; NOW marks the checkpoint each container runs on.
		name := ckclient.ContainerName(e.ctx, ft)
		if len(rows) != 2 || !strings.HasPrefix(rows[0], m.ID+" ") || !strings.HasPrefix(rows[1], "└─ "+child.ID+" ") ||
			name == "" || strings.Fields(rows[1])[3] != name || !strings.HasSuffix(rows[1], "◀ "+name) || !strings.Contains(rows[0], "◀ ") {
			t.Fatalf("checkpoint ls printed\n%s\nwant %s (where the other forks and web run), then %s of %s (%s) as its child, where it runs",
				strings.Join(rows, "\n"), m.ID, child.ID, name, ids[0])
		}
	})

	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args []string
			want string
		}{
			{"names taken", []string{"fork", "-n", "4", m.ID}, "container web-fork-1 already exists"},

			{"a name containerd refuses", []string{"fork", "--prefix", "no/slash", m.ID}, "fork name from prefix"},
			{"a directory without cklite.json", []string{"fork", "--image-path", e.d.Dir, m.ID}, "not a cklite checkpoint"},
			{"another checkpoint's images", []string{"fork", "--image-path", childDir, m.ID}, "holds checkpoint"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := containerIDs(t, e)
				// At most the line announcing the forks: none started.
				if out := ckliteFails(t, e.d, tc.want, tc.args...); strings.Contains(out, "running") {
					t.Fatalf("printed %q before refusing", out)
				}
				if after := containerIDs(t, e); !slices.Equal(after, before) {
					t.Fatalf("containers %v after a refused fork, %v before", after, before)
				}
			})
		}
	})

	t.Run("no forks", func(t *testing.T) {
		if out := ckliteMisuse(t, e.d, "-n 0: want at least one fork", "fork", "-n", "0", m.ID); out != "" {
			t.Fatalf("printed %q before refusing", out)
		}
	})

	t.Run("original gone", func(t *testing.T) {
		orig, err := e.d.Client().LoadContainer(e.ctx, "web")
		if err != nil {
			t.Fatal(err)
		}
		e.deleteTask(t, orig)
		if err := orig.Delete(e.ctx, client.WithSnapshotCleanup); err != nil {
			t.Fatal(err)
		}
		before := containerIDs(t, e)
		ckliteFails(t, e.d, "container web, of which checkpoint "+m.ID+" was taken, no longer exists", "fork", "--prefix", "late", m.ID)
		if after := containerIDs(t, e); !slices.Equal(after, before) {
			t.Fatalf("containers %v after a refused fork, %v before", after, before)
		}
	})
}

// forkedIDs returns the container ids of the forks `cklite fork` printed as running in out.
func forkedIDs(t *testing.T, e *ckEnv, out string) []string {
	t.Helper()
	var names []string
	for _, l := range strings.Split(out, "\n") {
		if sub := forkLineRE.FindStringSubmatch(l); sub != nil {
			names = append(names, sub[1])
		}
	}
	return forkIDsByName(t, e, names)
}

// forkIDsByName returns the container ids of the forks with the nerdctl names names: random,
// 64 hex digits.
func forkIDsByName(t *testing.T, e *ckEnv, names []string) []string {
	t.Helper()
	var ids []string
	for _, name := range names {
		cs, err := e.d.Client().Containers(e.ctx, fmt.Sprintf("labels.%q==%q", "nerdctl/name", name))
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) != 1 || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(cs[0].ID()) {
			t.Fatalf("%d containers named %s, want one fork with a 64-hex id", len(cs), name)
		}
		ids = append(ids, cs[0].ID())
	}
	return ids
}

// procIdentity is what sets the init process of container id's task apart from another's: its
// cgroups and its network namespace, as the host sees them.
func procIdentity(t *testing.T, e *ckEnv, id string) string {
	t.Helper()
	pid := e.taskOf(t, id).Pid()
	cgroups, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatalf("cgroups of %s (pid %d): %v", id, pid, err)
	}
	netns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatalf("network namespace of %s (pid %d): %v", id, pid, err)
	}
	return netns + "\n" + string(cgroups)
}

// containerIDs lists the daemon's containers.
func containerIDs(t *testing.T, e *ckEnv) []string {
	t.Helper()
	cs, err := e.d.Client().Containers(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ID()
	}
	slices.Sort(ids)
	return ids
}
