package integration

import (
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/checkpoint"
)

// TestCheckpointRestoreBadInput restores from image directories that are missing, not a
// checkpoint, damaged, or whose frozen layer is gone (a checkpoint from another host): each
// restore fails with an error naming the cause, and the intact checkpoint then restores into the
// very container the failed restore was tried on.
func TestCheckpointRestoreBadInput(t *testing.T) {
	e := newCkEnv(t)
	_, task, cnt := e.startCounter(t, "source")
	good, _, at := e.markedCheckpoint(t, task, cnt, "good")

	// damaged copies the good image directory and lets damage break the copy.
	damaged := func(t *testing.T, damage func(dir string) error) string {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "damaged")
		if out, err := exec.Command("cp", "-a", good, dir).CombinedOutput(); err != nil {
			t.Fatalf("copying the image directory: %v: %s", err, out)
		}
		if err := damage(dir); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	cases := []struct {
		name string
		dir  func(t *testing.T) string
		// causes: the error must name one of them.
		causes func(dir string) []string
	}{
		{
			name:   "missing image directory",
			dir:    func(t *testing.T) string { return filepath.Join(e.d.Dir, "no-such-checkpoint") },
			causes: func(dir string) []string { return []string{dir} },
		},
		{
			name:   "empty directory",
			dir:    func(t *testing.T) string { return t.TempDir() },
			causes: func(dir string) []string { return []string{dir, checkpoint.MetaFile} },
		},
		{
			name: "corrupt cklite.json",
			dir: func(t *testing.T) string {
				return damaged(t, func(dir string) error {
					return os.WriteFile(filepath.Join(dir, checkpoint.MetaFile), []byte(`{"format": 1, "id": `), 0o600)
				})
			},
			causes: func(string) []string { return []string{checkpoint.MetaFile} },
		},
		{
			name: "memory pages deleted",
			dir: func(t *testing.T) string {
				return damaged(t, func(dir string) error {
					pages, err := filepath.Glob(filepath.Join(dir, "pages-*.img"))
					if err == nil && len(pages) == 0 {
						err = fmt.Errorf("no pages-*.img in %s: CRIU names its images otherwise", dir)
					}
					for _, p := range pages {
						if err == nil {
							err = os.Remove(p)
						}
					}
					return err
				})
			},
			causes: func(string) []string { return []string{"pages-"} },
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.records(t)
			dir := tc.dir(t)
			id := fmt.Sprintf("bad-%d", i)
			c := e.newContainer(t, id, e.img, counterSpec)
			_, err := e.restore(c, nil, client.WithRestoreImagePath(dir))
			expectErrorNaming(t, err, tc.causes(dir)...)
			if after := e.records(t); !slices.Equal(recordIDs(after), recordIDs(before)) {
				t.Fatalf("checkpoints before the failed restore %v, after it %v", recordIDs(before), recordIDs(after))
			}
			// Nothing of the failed restore may stand in the way of the intact checkpoint.
			if _, err := e.restore(c, nil, client.WithRestoreImagePath(good)); err != nil {
				t.Fatalf("restoring %s from the intact checkpoint after a failed restore: %v", id, err)
			}
			expectRolledBack(t, newCounter(e.d.RootfsPath(id)), at, "good")
			e.deleteTask(t, c)
		})
	}

	// The image directory of another host's checkpoint arrives; its frozen layer does not. Played
	// here by a checkpoint whose container, lease and frozen snapshot are removed.
	t.Run("frozen snapshot gone", func(t *testing.T) {
		c, task, _ := e.startCounter(t, "elsewhere")
		dir := checkpointDir(t, e.d, "elsewhere")
		m := e.checkpointTo(t, task, dir, &options.CheckpointOptions{Exit: true})
		waitForExit(t, e.ctx, task)
		e.deleteTask(t, c)
		if err := c.Delete(e.ctx, client.WithSnapshotCleanup); err != nil {
			t.Fatal(err)
		}
		if err := e.lm.Delete(e.ctx, leases.Lease{ID: checkpoint.LeaseID(m.ID)}); err != nil {
			t.Fatalf("removing the checkpoint's lease: %v", err)
		}
		// Without its lease the collector may have removed it already.
		if err := e.sn.Remove(e.ctx, m.Frozen); err != nil && !errdefs.IsNotFound(err) {
			t.Fatalf("removing the frozen snapshot %s: %v", m.Frozen, err)
		}
		r := e.newContainer(t, "from-elsewhere", e.img, counterSpec)
		_, err := e.restore(r, nil, client.WithRestoreImagePath(dir))
		expectErrorNaming(t, err, m.Frozen)
		if _, err := e.restore(r, nil, client.WithRestoreImagePath(good)); err != nil {
			t.Fatalf("restoring from the intact checkpoint after a failed restore: %v", err)
		}
		expectRolledBack(t, newCounter(e.d.RootfsPath("from-elsewhere")), at, "good")
	})
}

// expectErrorNaming fails t unless err is an error naming one of causes, and no crash of a shim.
func expectErrorNaming(t *testing.T, err error, causes ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one naming one of %q", causes)
	}
	if strings.Contains(err.Error(), "panic") || strings.Contains(err.Error(), "ttrpc: closed") {
		t.Fatalf("the shim crashed: %v", err)
	}
	if !slices.ContainsFunc(causes, func(c string) bool { return strings.Contains(err.Error(), c) }) {
		t.Fatalf("error names none of %q: %v%s", causes, err, criuErrors(err))
	}
	t.Logf("error as expected: %v", err)
}

// TestCheckpointFailure makes CRIU refuse a checkpoint: the container holds what CRIU dumps only
// when told to, and the checkpoint does not tell it. The failed checkpoint must leave the task
// running, the same process, its filesystem as it was and writable, and nothing behind: no lease,
// no snapshot, no cklite.json. Where an option makes CRIU accept, the checkpoint then succeeds.
func TestCheckpointFailure(t *testing.T) {
	cases := []struct {
		name string
		// holder is the holderScript mode the container runs beside the counter.
		holder string
		mounts []specs.Mount
		// listen, if set, is a host directory (mounted at /ext) where the test serves
		// holder.sock and waits for the container's connection.
		listen bool
		// fix, if set, are options with which CRIU accepts the checkpoint.
		fix *options.CheckpointOptions
	}{
		{name: "file lock without FileLocks", holder: "flock", fix: &options.CheckpointOptions{FileLocks: true}},
		{name: "external unix socket without ExternalUnixSockets", holder: "external", listen: true},
	}

	e := newCkEnv(t)
	sandbox := e.sandboxImage(t)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("refused-%d", i)
			spec := []oci.SpecOpts{
				oci.WithProcessArgs("sh", "-c", `python3 -c "$HOLDER" `+tc.holder+` & `+workload.CounterScript),
				oci.WithEnv([]string{"HOLDER=" + holderScript}),
			}
			var accepted <-chan net.Conn
			if tc.listen {
				hostDir := t.TempDir()
				accepted = serveUnix(t, filepath.Join(hostDir, "holder.sock"))
				spec = append(spec, oci.WithMounts([]specs.Mount{{
					Destination: "/ext", Type: "bind", Source: hostDir, Options: []string{"rbind", "rw"},
				}}))
			}
			c := e.newContainer(t, id, sandbox, spec...)
			task, err := startTask(e.ctx, c)
			if err != nil {
				t.Fatalf("starting %s: %v", id, err)
			}
			cnt := newCounter(e.d.RootfsPath(id))
			writeMarkFiles(t, cnt.Rootfs, "refused")
			if answer := probe(t, cnt.Rootfs, "holder"); strings.Contains(answer, "error") {
				t.Fatalf("the holder is not holding what it should: %q", answer)
			}
			if accepted != nil {
				select {
				case conn := <-accepted:
					t.Cleanup(func() { conn.Close() })
				case <-time.After(30 * time.Second):
					t.Fatal("the container did not connect to the host's socket")
				}
			}
			at := cnt.advance(t, 3)
			leasesBefore, snapshotsBefore := e.leaseIDs(t), e.snapshotNames(t)
			info, err := c.Info(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			rootfsBefore, err := e.sn.Stat(e.ctx, info.SnapshotKey)
			if err != nil {
				t.Fatal(err)
			}

			dir := checkpointDir(t, e.d, id)
			err = e.checkpointErr(task, dir, nil)
			if err == nil {
				t.Fatalf("the checkpoint succeeded: CRIU should refuse (%s), so this case tests no failure", tc.name)
			}
			t.Logf("checkpoint failed as expected: %v%s", err, criuErrors(err))

			e.expectStatus(t, task, client.Running, "after a failed checkpoint")
			expectContinues(t, cnt, at)
			if got, err := readMarks(cnt.Rootfs); err != nil || !maps.Equal(got, wantMarks("refused")) {
				t.Fatalf("after the failed checkpoint the marks are %v (%v), want %v", got, err, wantMarks("refused"))
			}
			if out := e.exec(t, task, "sh", "-c", "echo written > /after-failure && cat /after-failure /"+marksDir+"/kept"); out != "written\nrefused" {
				t.Fatalf("after the failed checkpoint the container wrote and read %q, want %q", out, "written\nrefused")
			}
			if after := e.leaseIDs(t); !slices.Equal(after, leasesBefore) {
				t.Fatalf("leases before the failed checkpoint %v, after it %v: it left one behind", leasesBefore, after)
			}
			if after := e.snapshotNames(t); !slices.Equal(slices.Sorted(slices.Values(after)), slices.Sorted(slices.Values(snapshotsBefore))) {
				t.Fatalf("cklite's snapshots before the failed checkpoint %v, after it %v: it left one behind or lost one", snapshotsBefore, after)
			}
			if now, err := e.sn.Stat(e.ctx, info.SnapshotKey); err != nil || now.Parent != rootfsBefore.Parent {
				t.Fatalf("after the failed checkpoint the container's snapshot %s is %+v (%v), want it on %s as before", info.SnapshotKey, now, err, rootfsBefore.Parent)
			}
			if m, err := checkpoint.Read(dir); err == nil {
				t.Fatalf("the failed checkpoint left %s in %s, describing checkpoint %s", checkpoint.MetaFile, dir, m.ID)
			}

			if tc.fix != nil {
				fixed := checkpointDir(t, e.d, id+"-fixed")
				e.checkpointTo(t, task, fixed, tc.fix)
				e.expectStatus(t, task, client.Running, "after a checkpoint that leaves it running")
			}
		})
	}
}

// leaseIDs lists the ids of the namespace's leases, sorted.
func (e *ckEnv) leaseIDs(t *testing.T) []string {
	t.Helper()
	ls, err := e.lm.List(e.ctx)
	if err != nil {
		t.Fatalf("listing leases: %v", err)
	}
	ids := make([]string, len(ls))
	for i, l := range ls {
		ids[i] = l.ID
	}
	slices.Sort(ids)
	return ids
}

// serveUnix listens on the unix socket path and hands out the first connection; the listener is
// closed when the test ends.
func serveUnix(t *testing.T, path string) <-chan net.Conn {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		if conn, err := l.Accept(); err == nil {
			accepted <- conn
		}
	}()
	t.Cleanup(func() { l.Close() })
	return accepted
}

// TestCheckpointRefusedWhileExecRuns: a process started with exec outside the init's process tree
// that CRIU dumps (any in a container annotated cklite.io/exec-in-tree=false, or without a PID
// namespace of its own)
// would be lost by a memory checkpoint; it is refused, naming the exec, and leaves the task, the
// exec'd process and the checkpoint list as they were. Once the exec'd process is gone the
// checkpoint is taken.
func TestCheckpointRefusedWhileExecRuns(t *testing.T) {
	e := newCkEnv(t)
	// Its execs run outside the init's process tree (opted out).
	c := e.newContainer(t, "execs", e.img, counterSpec, oci.WithAnnotations(map[string]string{"cklite.io/exec-in-tree": "false"}))
	task, err := startTask(e.ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	cnt := newCounter(e.d.RootfsPath("execs"))
	p := e.newExec(t, task, cio.NullIO, "sleep", "1000")
	if err := p.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	exited, err := p.Wait(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	at := cnt.advance(t, 2)
	leasesBefore := e.leaseIDs(t)

	err = e.checkpointErr(task, checkpointDir(t, e.d, "refused"), nil)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), p.ID()) {
		t.Fatalf("checkpoint with a running exec'd process: %v, want FailedPrecondition naming exec %s", err, p.ID())
	}
	e.expectStatus(t, task, client.Running, "after the refused checkpoint")
	expectContinues(t, cnt, at)
	if st, err := p.Status(e.ctx); err != nil || st.Status != client.Running {
		t.Fatalf("the exec'd process after the refused checkpoint: %+v %v, want running", st, err)
	}
	if after := e.leaseIDs(t); !slices.Equal(after, leasesBefore) {
		t.Fatalf("leases before the refused checkpoint %v, after it %v", leasesBefore, after)
	}

	if err := p.Kill(e.ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	if _, err := p.Delete(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.checkpointTo(t, task, checkpointDir(t, e.d, "accepted"), nil)
	e.expectStatus(t, task, client.Running, "after the checkpoint")
}
