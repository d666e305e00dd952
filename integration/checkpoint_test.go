package integration

// The TestCheckpoint tests hold cklite's checkpoints to their semantics, through every client that
// can ask for one (the containerd Go client, ctr, nerdctl), on the cklite runtime and snapshotter:
//
//   - a checkpoint captures memory AND filesystem; the task keeps running after it (on a fresh
//     writable layer over the frozen one) unless CheckpointOptions.Exit says otherwise;
//   - any restore, of the same container or of a new one, brings back both: the counter workload
//     continues from its checkpointed value with the same token, a file written after the
//     checkpoint is gone, a file deleted after it is back;
//   - the CRIU image directory holds cklite.json, and a containerd lease cklite.checkpoint.<id>
//     holds the frozen snapshot cklite/checkpoint/<id>.
//
// This file has the helpers and the three client flows; checkpoint_*_test.go the rest.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/localimage"
)

// ckEnv is a daemon with cklite-snapshotter and busybox unpacked into it, for checkpoint tests.
type ckEnv struct {
	d   *harness.Daemon
	sn  snapshots.Snapshotter
	lm  leases.Manager
	img client.Image // busybox
	// ctx is the daemon's namespace, bounded so a hanging shim fails the test rather than the
	// run, and without fsEnv's lease: what a checkpoint leaves behind is what these tests check.
	ctx context.Context
}

// ckTimeout bounds each checkpoint test's client calls; the rollback loop is the longest.
const ckTimeout = 10 * time.Minute

func newCkEnv(t *testing.T) *ckEnv {
	t.Helper()
	skipUnbuiltShim(t, harness.CkliteRuntime)
	fs := newFSEnv(t)
	ctx, cancel := context.WithTimeout(fs.d.Context(context.Background()), ckTimeout)
	t.Cleanup(cancel)
	return &ckEnv{d: fs.d, sn: fs.sn, lm: fs.d.Client().LeasesService(), img: fs.img, ctx: ctx}
}

// sandboxImage imports the python3 sandbox image and unpacks it into cklite.
func (e *ckEnv) sandboxImage(t *testing.T) client.Image {
	t.Helper()
	sandbox, err := localimage.Sandbox(e.ctx, localimage.CacheDir(), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.d.Import(e.ctx, sandbox); err != nil {
		t.Fatal(err)
	}
	img, err := e.d.Client().GetImage(e.ctx, sandbox.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := img.Unpack(e.ctx, ckliteSnapshotter); err != nil {
		t.Fatalf("unpacking the sandbox image into cklite: %v", err)
	}
	return img
}

// newContainer creates container id of img on a new cklite snapshot, run by the cklite runtime;
// opts apply after the image's config.
func (e *ckEnv) newContainer(t *testing.T, id string, img client.Image, opts ...oci.SpecOpts) client.Container {
	t.Helper()
	c, err := e.d.Client().NewContainer(e.ctx, id,
		client.WithSnapshotter(ckliteSnapshotter),
		client.WithNewSnapshot(id, img),
		client.WithRuntime(harness.CkliteRuntime, nil),
		client.WithNewSpec(append([]oci.SpecOpts{oci.WithImageConfig(img)}, opts...)...))
	if err != nil {
		t.Fatalf("creating container %s: %v", id, err)
	}
	return c
}

// counterSpec runs the counter workload.
var counterSpec = oci.WithProcessArgs("sh", "-c", workload.CounterScript)

// startCounter creates and starts container id running the counter workload on busybox.
func (e *ckEnv) startCounter(t *testing.T, id string) (client.Container, client.Task, counter) {
	t.Helper()
	c := e.newContainer(t, id, e.img, counterSpec)
	task, err := startTask(e.ctx, c)
	if err != nil {
		t.Fatalf("starting %s: %v", id, err)
	}
	return c, task, newCounter(e.d.RootfsPath(id))
}

// withOptions sends o as the checkpoint's options, the runc type every client sends.
func withOptions(o *options.CheckpointOptions) client.CheckpointTaskOpts {
	return func(r *client.CheckpointTaskInfo) error {
		r.Options = o
		return nil
	}
}

// withUniqueName names the checkpoint image the Go client makes for a non-runc runtime even with
// an image path: its default name has a resolution of one second, and a second checkpoint of the
// same container within that second would fail with AlreadyExists, whatever the runtime.
func withUniqueName(id string) client.CheckpointTaskOpts {
	return client.WithCheckpointName("checkpoint/" + id + ":" + randomTag())
}

func randomTag() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// checkpointTo checkpoints task with the Go client into the image directory dir, with options o
// (nil: none but the path) and checks what it recorded.
func (e *ckEnv) checkpointTo(t *testing.T, task client.Task, dir string, o *options.CheckpointOptions) checkpoint.Meta {
	t.Helper()
	start := time.Now()
	if err := e.checkpointErr(task, dir, o); err != nil {
		t.Fatalf("checkpoint of %s into %s: %v%s", task.ID(), dir, err, criuErrors(err))
	}
	logTiming(t, "Go client checkpoint of "+task.ID()+" with an image path", start)
	return e.expectCheckpoint(t, dir, task.ID())
}

// markedCheckpoint sets the marks of tag, holds the counter still, and checkpoints task, leaving
// it running, into a new image directory named tag. It returns the directory, what the
// checkpoint recorded, and where the counter was.
func (e *ckEnv) markedCheckpoint(t *testing.T, task client.Task, c counter, tag string) (string, checkpoint.Meta, workload.Count) {
	t.Helper()
	writeMarks(t, c.Rootfs, tag)
	at := c.advance(t, 3)
	dir := checkpointDir(t, e.d, tag)
	return dir, e.checkpointTo(t, task, dir, nil), at
}

// checkpointErr is checkpointTo for checkpoints that may fail: it returns the error and checks
// nothing.
func (e *ckEnv) checkpointErr(task client.Task, dir string, o *options.CheckpointOptions) error {
	if o == nil {
		o = &options.CheckpointOptions{}
	}
	o.ImagePath = dir
	_, err := task.Checkpoint(e.ctx, withOptions(o), withUniqueName(task.ID()))
	return err
}

// criuLogRE finds the CRIU log a shim names in a failed checkpoint's error: cklite's
// "(CRIU log: PATH)", runc-v2's "path= PATH".
var criuLogRE = regexp.MustCompile(`(?:CRIU log: |path= )([^\s)]+)`)

// criuErrors returns the error lines of the CRIU log err names, for a failure message: the log
// lives in the task's bundle, which is gone when the test has ended.
func criuErrors(err error) string {
	m := criuLogRE.FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	data, rerr := os.ReadFile(m[1])
	if rerr != nil {
		return fmt.Sprintf("\n(reading the CRIU log: %v)", rerr)
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, "Error") {
			lines = append(lines, l)
		}
	}
	return "\nerrors in the CRIU log:\n" + strings.Join(lines, "\n")
}

// expectCheckpoint reads the cklite.json of image directory dir and checks it describes a
// memory+fs checkpoint of container, held by its lease.
func (e *ckEnv) expectCheckpoint(t *testing.T, dir, container string) checkpoint.Meta {
	t.Helper()
	if os.Getenv("CK_CALIBRATE") != "" {
		return checkpoint.Meta{}
	}
	m, err := checkpoint.Read(dir)
	if err != nil {
		t.Fatalf("the CRIU image directory %s has no valid %s: %v", dir, checkpoint.MetaFile, err)
	}
	e.expectMeta(t, m, container)
	return m
}

// expectMeta checks m describes a memory+fs checkpoint of container in this daemon's namespace,
// and that its lease holds its frozen snapshot, which containerd knows as a committed cklite
// snapshot.
func (e *ckEnv) expectMeta(t *testing.T, m checkpoint.Meta, container string) {
	t.Helper()
	if os.Getenv("CK_CALIBRATE") != "" {
		return
	}
	var problems []string
	for _, f := range []struct{ field, got, want string }{
		{"container", m.Container, container},
		{"namespace", m.Namespace, e.d.Namespace},
		{"contents", string(m.Contents), string(checkpoint.MemoryAndFS)},
		{"snapshotter", m.Snapshotter, ckliteSnapshotter},
		{"frozen", m.Frozen, checkpoint.FrozenName(m.ID)},
	} {
		if f.got != f.want {
			problems = append(problems, fmt.Sprintf("%s %q, want %q", f.field, f.got, f.want))
		}
	}
	if len(problems) > 0 {
		t.Fatalf("%s of checkpoint %s: %s", checkpoint.MetaFile, m.ID, strings.Join(problems, "; "))
	}
	r := e.record(t, m.ID)
	if r.Frozen != m.Frozen || r.Parent != m.Parent || r.Container != m.Container {
		t.Fatalf("lease %s says frozen %q, parent %q, container %q; %s says %q, %q, %q",
			checkpoint.LeaseID(m.ID), r.Frozen, r.Parent, r.Container, checkpoint.MetaFile, m.Frozen, m.Parent, m.Container)
	}
	res, err := e.lm.ListResources(e.ctx, leases.Lease{ID: checkpoint.LeaseID(m.ID)})
	if err != nil {
		t.Fatalf("resources of lease %s: %v", checkpoint.LeaseID(m.ID), err)
	}
	want := leases.Resource{ID: m.Frozen, Type: "snapshots/" + ckliteSnapshotter}
	if !slices.Contains(res, want) {
		t.Fatalf("lease %s holds %v, not the frozen snapshot %v", checkpoint.LeaseID(m.ID), res, want)
	}
	info, err := e.sn.Stat(e.ctx, m.Frozen)
	if err != nil {
		t.Fatalf("frozen snapshot of checkpoint %s: %v", m.ID, err)
	}
	if info.Kind != snapshots.KindCommitted {
		t.Fatalf("frozen snapshot %s is %s, want committed", m.Frozen, info.Kind)
	}
}

// record is checkpoint id as checkpoint.List reads it from the leases.
func (e *ckEnv) record(t *testing.T, id string) checkpoint.Record {
	t.Helper()
	recs := e.records(t)
	i := slices.IndexFunc(recs, func(r checkpoint.Record) bool { return r.ID == id })
	if i < 0 {
		t.Fatalf("checkpoint.List does not list checkpoint %s (no lease %s); it lists %v", id, checkpoint.LeaseID(id), recordIDs(recs))
	}
	return recs[i]
}

func (e *ckEnv) records(t *testing.T) []checkpoint.Record {
	t.Helper()
	recs, err := checkpoint.List(e.ctx, e.lm, e.d.Namespace)
	if err != nil {
		t.Fatalf("listing checkpoints: %v", err)
	}
	return recs
}

func recordIDs(recs []checkpoint.Record) []string {
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	return ids
}

// newRecord returns the one checkpoint listed now that was not listed in before: how a test finds
// a checkpoint whose image directory it cannot read (the daemon's temporary one).
func (e *ckEnv) newRecord(t *testing.T, before []checkpoint.Record) checkpoint.Record {
	t.Helper()
	if os.Getenv("CK_CALIBRATE") != "" {
		return checkpoint.Record{}
	}
	var added []checkpoint.Record
	for _, r := range e.records(t) {
		if !slices.ContainsFunc(before, func(b checkpoint.Record) bool { return b.ID == r.ID }) {
			added = append(added, r)
		}
	}
	if len(added) != 1 {
		t.Fatalf("%d new checkpoint leases (%v) after one checkpoint, want 1", len(added), recordIDs(added))
	}
	return added[0]
}

// restore creates and starts c's task from the checkpoint in the image directory dir with io
// (nil: none). A task that was created but did not start is deleted again, so that the caller may
// try another checkpoint.
func (e *ckEnv) restore(c client.Container, io cio.Creator, opts ...client.NewTaskOpts) (client.Task, error) {
	if io == nil {
		io = cio.NullIO
	}
	task, err := c.NewTask(e.ctx, io, opts...)
	if err != nil {
		return nil, err
	}
	if err := task.Start(e.ctx); err != nil {
		_, _ = task.Delete(e.ctx, client.WithProcessKill)
		return nil, err
	}
	return task, nil
}

// rollback kills c's task, if it has one, and restores c from the checkpoint in dir: the Go
// client's way of rolling a container back.
func (e *ckEnv) rollback(t *testing.T, c client.Container, dir string) client.Task {
	t.Helper()
	e.deleteTask(t, c)
	task, err := e.restore(c, nil, client.WithRestoreImagePath(dir))
	if err != nil {
		t.Fatalf("restoring %s from %s: %v", c.ID(), dir, err)
	}
	return task
}

// deleteTask kills and deletes c's task, if it has one.
func (e *ckEnv) deleteTask(t *testing.T, c client.Container) {
	t.Helper()
	task, err := c.Task(e.ctx, nil)
	if errdefs.IsNotFound(err) {
		return
	}
	if err == nil {
		_, err = task.Delete(e.ctx, client.WithProcessKill)
	}
	if err != nil {
		t.Fatalf("deleting the task of %s: %v", c.ID(), err)
	}
}

// expectStatus fails the test unless task is in status want.
func (e *ckEnv) expectStatus(t *testing.T, task client.Task, want client.ProcessStatus, when string) {
	t.Helper()
	st, err := task.Status(e.ctx)
	if err != nil {
		t.Fatalf("status of %s %s: %v", task.ID(), when, err)
	}
	if st.Status != want {
		t.Fatalf("task %s is %s %s, want %s", task.ID(), st.Status, when, want)
	}
}

// expectContinues checks the counter, held at `at` by the caller, still belongs to the same
// process and counts on from there: a checkpoint that leaves the task running must not restart it.
func expectContinues(t *testing.T, c counter, at workload.Count) workload.Count {
	t.Helper()
	got := c.advance(t, 3)
	if got.Token != at.Token || got.N < at.N+3 {
		t.Fatalf("after the checkpoint the counter went from %+v to %+v: the task did not keep running", at, got)
	}
	return got
}

// The marks are files in a busybox container's root filesystem that a test sets before a
// checkpoint (writeMarks) and changes after it (changeMarks): a restore must bring back exactly
// the checkpoint's (expectMarks). They cover a written file, a deleted one, an edited one (all in
// the writable layer) and a file of the image that is deleted after the checkpoint (a whiteout).
const (
	marksDir  = "ck-marks"
	imageFile = "bin/vi" // a symlink to /bin/busybox in the busybox image
)

// writeMarks sets the marks of checkpoint tag: kept, doomed and edited holding tag, and nothing
// else in marksDir; the image's file is there.
func writeMarks(t *testing.T, rootfs, tag string) {
	t.Helper()
	writeMarkFiles(t, rootfs, tag)
	if _, err := os.Lstat(filepath.Join(rootfs, imageFile)); errors.Is(err, os.ErrNotExist) {
		err = os.Symlink("/bin/busybox", filepath.Join(rootfs, imageFile))
		if err != nil {
			t.Fatal(err)
		}
	}
}

// writeMarkFiles is writeMarks without the image's file, for images other than busybox.
func writeMarkFiles(t *testing.T, rootfs, tag string) {
	t.Helper()
	dir := filepath.Join(rootfs, marksDir)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name := range wantMarks(tag) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(tag), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func wantMarks(tag string) map[string]string {
	return map[string]string{"kept": tag, "doomed": tag, "edited": tag}
}

// changeMarks moves the filesystem past a checkpoint: doomed and the image's file deleted,
// edited rewritten, a new file written.
func changeMarks(t *testing.T, rootfs, tag string) {
	t.Helper()
	dir := filepath.Join(rootfs, marksDir)
	for _, err := range []error{
		os.Remove(filepath.Join(dir, "doomed")),
		os.WriteFile(filepath.Join(dir, "edited"), []byte("edited after the checkpoint, "+tag), 0o644),
		os.WriteFile(filepath.Join(dir, "written-after-"+tag), []byte(tag), 0o644),
		os.Remove(filepath.Join(rootfs, imageFile)),
	} {
		if err != nil {
			t.Fatalf("changing the marks after the checkpoint: %v", err)
		}
	}
}

// expectMarks checks the root filesystem holds exactly the marks of checkpoint tag.
func expectMarks(t *testing.T, rootfs, tag string) {
	t.Helper()
	if os.Getenv("CK_CALIBRATE") != "" {
		return
	}
	got, err := readMarks(rootfs)
	if err != nil {
		t.Fatalf("reading the marks after restoring checkpoint %s: %v", tag, err)
	}
	if want := wantMarks(tag); !maps.Equal(got, want) {
		t.Fatalf("after restoring checkpoint %s, %s holds %v, want %v: the filesystem is not the checkpoint's "+
			"(a file written after it must be gone, one deleted after it back, one edited after it as it was)",
			tag, filepath.Join(rootfs, marksDir), got, want)
	}
	if _, err := os.Lstat(filepath.Join(rootfs, imageFile)); err != nil {
		t.Fatalf("after restoring checkpoint %s, /%s, a file of the image deleted after the checkpoint, is not back: %v", tag, imageFile, err)
	}
}

func readMarks(rootfs string) (map[string]string, error) {
	dir := filepath.Join(rootfs, marksDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	got := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		got[e.Name()] = string(data)
	}
	return got, nil
}

// expectRolledBack checks a restored counter container holds both halves of checkpoint tag: the
// counter's memory (at) and the marks.
func expectRolledBack(t *testing.T, c counter, at workload.Count, tag string) {
	t.Helper()
	expectMarks(t, c.Rootfs, tag)
	c.expectRestored(t, at)
}

// checkpointDir is a fresh path for a CRIU image directory below the daemon's, which its
// teardown removes.
func checkpointDir(t *testing.T, d *harness.Daemon, name string) string {
	t.Helper()
	dir := filepath.Join(d.Dir, "checkpoints", name)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// metaOfImage reads the cklite.json inside the CRIU tar of a checkpoint image in the content store.
func (e *ckEnv) metaOfImage(t *testing.T, img client.Image) checkpoint.Meta {
	t.Helper()
	if os.Getenv("CK_CALIBRATE") != "" {
		return checkpoint.Meta{}
	}
	m, err := checkpoint.FromImage(e.ctx, e.d.Client().ContentStore(), img.Target())
	if err != nil {
		t.Fatalf("checkpoint image %s: %v", img.Name(), err)
	}
	return m
}

// mustCtr runs ctr with cliResult's timeout and returns its standard output, failing the test
// unless it exits 0 (with CRIU's errors, when ctr names its log).
func mustCtr(t *testing.T, d *harness.Daemon, args ...string) string {
	t.Helper()
	r := ctrResult(t, d, "", args...)
	if r.code != 0 {
		t.Fatalf("ctr %s: exit status %d: %s%s", strings.Join(args, " "), r.code, strings.TrimSpace(r.stderr), criuErrors(errors.New(r.stderr)))
	}
	return r.stdout
}

// expectFrozenListed checks `ctr snapshots ls` on cklite shows the frozen snapshot of each of ms.
func expectFrozenListed(t *testing.T, d *harness.Daemon, ms ...checkpoint.Meta) {
	t.Helper()
	if os.Getenv("CK_CALIBRATE") != "" {
		return
	}
	out := mustCtr(t, d, "snapshots", "--snapshotter", ckliteSnapshotter, "ls")
	for _, m := range ms {
		if !strings.Contains(out, checkpoint.FrozenName(m.ID)+" ") {
			t.Fatalf("ctr snapshots ls does not show the frozen snapshot %s of checkpoint %s:\n%s", checkpoint.FrozenName(m.ID), m.ID, out)
		}
	}
}

// expectParent checks m's parent checkpoint is parent, in cklite.json and in the snapshot chain:
// the frozen layer of m is stacked right on parent's.
func (e *ckEnv) expectParent(t *testing.T, m, parent checkpoint.Meta) {
	t.Helper()
	if os.Getenv("CK_CALIBRATE") != "" {
		return
	}
	if m.Parent != parent.ID {
		t.Fatalf("checkpoint %s has parent %q, want %s", m.ID, m.Parent, parent.ID)
	}
	info, err := e.sn.Stat(e.ctx, m.Frozen)
	if err != nil {
		t.Fatal(err)
	}
	if info.Parent != parent.Frozen {
		t.Fatalf("frozen snapshot %s is stacked on %q, want %s, the frozen snapshot of its parent checkpoint", m.Frozen, info.Parent, parent.Frozen)
	}
}

// TestCheckpointGoClient checkpoints through the containerd Go client, into an image directory and
// into a checkpoint image, and restores into new containers, one or three at once from one
// checkpoint, while the original runs on.
func TestCheckpointGoClient(t *testing.T) {
	e := newCkEnv(t)
	_, task, c := e.startCounter(t, "original")
	dir, m, at := e.markedCheckpoint(t, task, c, "ck1")
	e.expectStatus(t, task, client.Running, "after a checkpoint that leaves it running")
	if m.Parent != "" {
		t.Fatalf("the first checkpoint of a container has parent %q, want none", m.Parent)
	}
	changeMarks(t, c.Rootfs, "ck1")
	past := expectContinues(t, c, at)

	t.Run("restore into a new container", func(t *testing.T) {
		r := e.newContainer(t, "restored", e.img, counterSpec)
		start := time.Now()
		if _, err := e.restore(r, nil, client.WithRestoreImagePath(dir)); err != nil {
			t.Fatalf("restoring a new container from %s: %v", dir, err)
		}
		logTiming(t, "Go client NewTask(WithRestoreImagePath) + Start, new container", start)
		expectRolledBack(t, newCounter(e.d.RootfsPath("restored")), at, "ck1")
	})

	t.Run("checkpoint image in the content store", func(t *testing.T) {
		before := e.records(t)
		img, err := task.Checkpoint(e.ctx, withUniqueName(task.ID()))
		if err != nil {
			t.Fatalf("checkpoint without an image path: %v", err)
		}
		m2 := e.metaOfImage(t, img)
		e.expectMeta(t, m2, "original")
		if r := e.newRecord(t, before); r.ID != m2.ID {
			t.Fatalf("the new checkpoint lease is %s, the checkpoint image's %s says %s", r.ID, checkpoint.MetaFile, m2.ID)
		}
		// The container's last checkpoint is ck1.
		e.expectParent(t, m2, m)
		e.expectStatus(t, task, client.Running, "after a checkpoint that leaves it running")
		r := e.newContainer(t, "restored-from-image", e.img, counterSpec)
		if _, err := e.restore(r, nil, client.WithTaskCheckpoint(img)); err != nil {
			t.Fatalf("restoring a new container from checkpoint image %s: %v", img.Name(), err)
		}
		rc := newCounter(e.d.RootfsPath("restored-from-image"))
		// The checkpoint holds what the original had after ck1: the changed marks.
		got, err := readMarks(rc.Rootfs)
		if want := (map[string]string{"kept": "ck1", "edited": "edited after the checkpoint, ck1", "written-after-ck1": "ck1"}); err != nil || !maps.Equal(got, want) {
			t.Fatalf("the container restored from the checkpoint image holds the marks %v (%v), want %v", got, err, want)
		}
		rc.expectRestored(t, past)
	})

	t.Run("fork three at once", func(t *testing.T) {
		var forks []counter
		for i := range 3 {
			id := fmt.Sprintf("fork-%d", i)
			r := e.newContainer(t, id, e.img, counterSpec)
			if _, err := e.restore(r, nil, client.WithRestoreImagePath(dir)); err != nil {
				t.Fatalf("restoring fork %d from %s while %d forks of it run: %v", i, dir, i, err)
			}
			forks = append(forks, newCounter(e.d.RootfsPath(id)))
		}
		for i, f := range forks {
			expectMarks(t, f.Rootfs, "ck1")
			f.waitFor(t, fmt.Sprintf("fork %d at the checkpoint", i), func(x workload.Count) bool { return x == at })
		}
		// Each fork writes a file of its own and counts on alone: no other fork may see either.
		for i, f := range forks {
			if err := os.WriteFile(filepath.Join(f.Rootfs, "mine"), []byte(fmt.Sprint(i)), 0o644); err != nil {
				t.Fatal(err)
			}
			got := f.advance(t, 3*(i+1))
			if got.Token != at.Token || got.N < at.N+3*(i+1) {
				t.Fatalf("fork %d counted from %+v to %+v", i, at, got)
			}
			for j, other := range forks {
				if j == i {
					continue
				}
				if x := other.waitFor(t, "a count", func(workload.Count) bool { return true }); j > i && x != at {
					t.Fatalf("fork %d is at %+v after fork %d counted: forks are not independent (want %+v)", j, x, i, at)
				}
				data, err := os.ReadFile(filepath.Join(other.Rootfs, "mine"))
				if j > i && !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("fork %d sees /mine (%q, %v) that fork %d wrote", j, data, err, i)
				}
				if j < i && string(data) != fmt.Sprint(j) {
					t.Fatalf("fork %d's /mine holds %q (%v) after fork %d wrote its own, want %d", j, data, err, i, j)
				}
			}
		}
		// And the original ran on untouched.
		if x := c.waitFor(t, "a count", func(workload.Count) bool { return true }); x.Token != at.Token || x.N < past.N {
			t.Fatalf("the original is at %+v after the forks ran, want where it was, %+v", x, past)
		}
		if data, err := os.ReadFile(filepath.Join(c.Rootfs, "mine")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the original sees /mine (%q, %v) that the forks wrote", data, err)
		}
	})
}

// TestCheckpointCtr checkpoints with ctr: `ctr tasks checkpoint` (leave running, --exit, with and
// without --image-path) restored with the Go client, since ctr cannot restore from a directory;
// and `ctr containers checkpoint --task --rw` restored with `ctr containers restore --live --rw`
// into the same name and, while the original runs, into a new one: a fork, which the stock runc
// shim refuses (the restored spec keeps the original's cgroup).
func TestCheckpointCtr(t *testing.T) {
	e := newCkEnv(t)

	t.Run("ctr tasks checkpoint", func(t *testing.T) {
		const id = "ctr-task"
		container, task, c := e.ctrRunCounter(t, id)

		// The Go client under ctr names the checkpoint image it makes (even with --image-path,
		// for a runtime other than runc) after the time of the call, to the second: a second
		// checkpoint of the container within the same second would fail with AlreadyExists,
		// whatever the runtime. So each waits for the second in which the one before ended to pass.
		var ended time.Time
		ctrCheckpoint := func(args ...string) string {
			t.Helper()
			time.Sleep(time.Until(ended.Truncate(time.Second).Add(time.Second)))
			start := time.Now()
			out := mustCtr(t, e.d, append(append([]string{"tasks", "checkpoint"}, args...), id)...)
			ended = time.Now()
			logTiming(t, "ctr tasks checkpoint "+strings.Join(args, " "), start)
			return out
		}

		writeMarks(t, c.Rootfs, "leave-running")
		at1 := c.advance(t, 3)
		dir1 := checkpointDir(t, e.d, "ctr-leave-running")
		ctrCheckpoint("--image-path", dir1)
		m1 := e.expectCheckpoint(t, dir1, id)
		e.expectStatus(t, task, client.Running, "after ctr tasks checkpoint without --exit")
		expectContinues(t, c, at1)

		writeMarks(t, c.Rootfs, "exit")
		at2 := c.advance(t, 3)
		dir2 := checkpointDir(t, e.d, "ctr-exit")
		ctrCheckpoint("--exit", "--image-path", dir2)
		m2 := e.expectCheckpoint(t, dir2, id)
		e.expectParent(t, m2, m1)
		waitForExit(t, e.ctx, task)
		expectFrozenListed(t, e.d, m1, m2)

		start := time.Now()
		e.rollback(t, container, dir1)
		logTiming(t, "Go client rollback to the ctr checkpoint", start)
		expectRolledBack(t, c, at1, "leave-running")
		changeMarks(t, c.Rootfs, "leave-running")
		e.rollback(t, container, dir2)
		expectRolledBack(t, c, at2, "exit")

		// Without --image-path the CRIU image, cklite.json included, goes into a checkpoint image.
		before := e.records(t)
		writeMarks(t, c.Rootfs, "image")
		at3 := c.advance(t, 3)
		name := strings.TrimSpace(ctrCheckpoint())
		img, err := e.d.Client().GetImage(e.ctx, name)
		if err != nil {
			t.Fatalf("checkpoint image %q that ctr printed: %v", name, err)
		}
		m3 := e.metaOfImage(t, img)
		e.expectMeta(t, m3, id)
		if r := e.newRecord(t, before); r.ID != m3.ID {
			t.Fatalf("the new checkpoint lease is %s, the checkpoint image's %s says %s", r.ID, checkpoint.MetaFile, m3.ID)
		}
		// The container was last restored from the --exit checkpoint.
		e.expectParent(t, m3, m2)
		changeMarks(t, c.Rootfs, "image")
		e.deleteTask(t, container)
		if _, err := e.restore(container, nil, client.WithTaskCheckpoint(img)); err != nil {
			t.Fatalf("restoring %s from checkpoint image %s: %v", id, name, err)
		}
		expectRolledBack(t, c, at3, "image")
	})

	t.Run("ctr containers checkpoint --task --rw", func(t *testing.T) {
		const id, ref = "ctr-container", "checkpoint/ctr-container:1"
		_, task, c := e.ctrRunCounter(t, id)
		writeMarks(t, c.Rootfs, "ctr-container")
		at := c.advance(t, 3)
		before := e.records(t)
		start := time.Now()
		mustCtr(t, e.d, "containers", "checkpoint", "--task", "--rw", id, ref)
		logTiming(t, "ctr containers checkpoint --task --rw", start)
		r := e.newRecord(t, before)
		e.expectMeta(t, r.Meta, id)
		expectFrozenListed(t, e.d, r.Meta)
		// ctr paused the task around the checkpoint and resumed it.
		e.expectStatus(t, task, client.Running, "after ctr containers checkpoint")
		changeMarks(t, c.Rootfs, "ctr-container")
		past := expectContinues(t, c, at)

		t.Run("restore a new container while the original runs", func(t *testing.T) {
			const fork = "ctr-fork"
			start := time.Now()
			mustCtr(t, e.d, "containers", "restore", "--live", "--rw", fork, ref)
			logTiming(t, "ctr containers restore --live --rw, new name", start)
			f := newCounter(e.d.RootfsPath(fork))
			expectRolledBack(t, f, at, "ctr-container")
			if x := c.waitFor(t, "a count", func(workload.Count) bool { return true }); x != past {
				t.Fatalf("the original is at %+v after its fork counted, want %+v", x, past)
			}
			if got, err := readMarks(c.Rootfs); err != nil || got["written-after-ctr-container"] == "" {
				t.Fatalf("the original's marks are %v (%v) after the fork was restored, want its own", got, err)
			}
			e.expectStatus(t, task, client.Running, "after a fork of it was restored")
		})

		t.Run("restore into the same name", func(t *testing.T) {
			mustCtr(t, e.d, "tasks", "delete", "--force", id)
			mustCtr(t, e.d, "containers", "delete", id)
			start := time.Now()
			mustCtr(t, e.d, "containers", "restore", "--live", "--rw", id, ref)
			logTiming(t, "ctr containers restore --live --rw, same name", start)
			expectRolledBack(t, c, at, "ctr-container")
		})
	})
}

// ctrRunCounter is `ctr run -d` of the counter workload on cklite, as container id.
func (e *ckEnv) ctrRunCounter(t *testing.T, id string) (client.Container, client.Task, counter) {
	t.Helper()
	mustCtr(t, e.d, "run", "-d", "--fifo-dir", e.d.FIFODir(), "--snapshotter", ckliteSnapshotter,
		"--runtime", harness.CkliteRuntime, busybox.Name, id, "sh", "-c", workload.CounterScript)
	container, err := e.d.Client().LoadContainer(e.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := container.Task(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return container, task, newCounter(e.d.RootfsPath(id))
}

// TestCheckpointNerdctlLifecycle is nerdctl's checkpoint flow on cklite: create (with and without
// --leave-running), ls, rm, stop and start --checkpoint. nerdctl passes no checkpoint options to
// a runtime other than runc, so cklite never learns nerdctl's Exit and the task keeps running
// either way; and where stock nerdctl restores memory over the current filesystem, cklite restores
// the checkpoint's filesystem too.
func TestCheckpointNerdctlLifecycle(t *testing.T) {
	e := newCkEnv(t)
	const name = "nerdctl-ckpt"
	id := runDetached(t, e.d, harness.CkliteRuntime, name, []string{"--snapshotter", ckliteSnapshotter}, "sh", "-c", workload.CounterScript)
	c := newCounter(e.d.RootfsPath(id))
	checkpoints := filepath.Join(e.d.Dir, "nerdctl", "checkpoints")

	create := func(t *testing.T, ckpt string, flags ...string) (checkpoint.Meta, workload.Count) {
		t.Helper()
		writeMarks(t, c.Rootfs, ckpt)
		at := c.advance(t, 3)
		start := time.Now()
		mustNerdctl(t, e.d, append(append([]string{"checkpoint", "create"}, flags...), name, ckpt)...)
		logTiming(t, "nerdctl checkpoint create "+strings.Join(flags, " "), start)
		m := e.expectCheckpoint(t, filepath.Join(checkpoints, ckpt), id)
		waitForStatus(t, e.d, name, "running")
		expectContinues(t, c, at)
		changeMarks(t, c.Rootfs, ckpt)
		return m, at
	}
	m1, at1 := create(t, "ck1")
	m2, at2 := create(t, "ck2", "--leave-running")
	e.expectParent(t, m2, m1)
	expectFrozenListed(t, e.d, m1, m2)
	expectListed := func(t *testing.T, want ...string) {
		t.Helper()
		out := mustNerdctl(t, e.d, "checkpoint", "ls", name)
		for _, ckpt := range []string{"ck1", "ck2"} {
			if listed := strings.Contains(out, ckpt); listed != slices.Contains(want, ckpt) {
				t.Fatalf("nerdctl checkpoint ls lists %s: %v, want %v:\n%s", ckpt, listed, !listed, out)
			}
		}
	}
	expectListed(t, "ck1", "ck2")

	startFrom := func(t *testing.T, ckpt string) {
		t.Helper()
		mustNerdctl(t, e.d, "stop", "-t", "0", name)
		start := time.Now()
		r := nerdctlResult(t, e.d, "", "start", "--checkpoint", ckpt, name)
		if r.code != 0 && strings.Contains(r.stderr, "content digest") && strings.Contains(r.stderr, "not found") {
			// Known nerdctl race: the blob it re-tars from the checkpoint directory is identical to
			// the one `checkpoint create` released, and containerd's GC may collect it meanwhile.
			t.Logf("nerdctl start --checkpoint hit the content GC race, retrying once: %s", r.stderr)
			start = time.Now()
			r = nerdctlResult(t, e.d, "", "start", "--checkpoint", ckpt, name)
		}
		if r.code != 0 {
			t.Fatalf("nerdctl start --checkpoint %s %s: exit status %d: %s", ckpt, name, r.code, strings.TrimSpace(r.stderr))
		}
		logTiming(t, "nerdctl start --checkpoint", start)
		waitForStatus(t, e.d, name, "running")
	}
	startFrom(t, "ck1")
	expectRolledBack(t, c, at1, "ck1")
	// From a rollback to the earlier checkpoint forward to the later one.
	changeMarks(t, c.Rootfs, "ck1")
	startFrom(t, "ck2")
	expectRolledBack(t, c, at2, "ck2")

	mustNerdctl(t, e.d, "checkpoint", "rm", name, "ck2")
	expectListed(t, "ck1")
	mustNerdctl(t, e.d, "stop", "-t", "0", name)
	if r := nerdctlResult(t, e.d, "", "start", "--checkpoint", "ck2", name); r.code == 0 {
		t.Fatal("nerdctl start --checkpoint of a removed checkpoint succeeded")
	}
	// The remaining checkpoint is unharmed by the removal and the failed start.
	startFrom(t, "ck1")
	expectRolledBack(t, c, at1, "ck1")
}
