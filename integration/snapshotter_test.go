package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/snapshotter/freeze"
)

const ckliteSnapshotter = "cklite"

// listRootfs prints every path of the container's root filesystem with its type, mode, owner and,
// for regular files, an md5 of the content: two listings are equal exactly when the trees are.
const listRootfs = `cd / && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev \) -prune -o -print | sort |
while read -r f; do
  if [ -f "$f" ] && [ ! -L "$f" ]; then echo "$f $(stat -c '%a %u %g' "$f") $(md5sum < "$f" | cut -c1-32)";
  else echo "$f $(stat -c '%F %a %u %g' "$f")"; fi
done`

// fsEnv is a daemon with cklite-snapshotter, busybox unpacked into it, and a lease that keeps
// whatever a test makes until the test ends.
type fsEnv struct {
	d   *harness.Daemon
	ctx context.Context
	sn  snapshots.Snapshotter
	img client.Image
}

func newFSEnv(t *testing.T) *fsEnv {
	t.Helper()
	d := startDaemon(t, harness.Config{CkliteSnapshotter: true})
	ctx := d.Context(context.Background())
	img := unpackBusybox(t, d)
	ctx, done, err := d.Client().WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { done(context.Background()) })
	return &fsEnv{d: d, ctx: ctx, sn: d.Client().SnapshotService(ckliteSnapshotter), img: img}
}

// unpackBusybox imports busybox into d and unpacks it into cklite-snapshotter.
func unpackBusybox(t *testing.T, d *harness.Daemon) client.Image {
	t.Helper()
	ctx := d.Context(context.Background())
	if err := d.Import(ctx, busybox); err != nil {
		t.Fatal(err)
	}
	img, err := d.Client().GetImage(ctx, busybox.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := img.Unpack(ctx, ckliteSnapshotter); err != nil {
		t.Fatalf("unpacking busybox into cklite: %v", err)
	}
	return img
}

// container makes a busybox container on the cklite snapshot key, prepared from parent first
// unless parent is "" (then key must exist), or from the image when parent is "image".
func (e *fsEnv) container(t *testing.T, id, key, parent string) client.Container {
	t.Helper()
	opts := []client.NewContainerOpts{client.WithSnapshotter(ckliteSnapshotter)}
	switch parent {
	case "image":
		opts = append(opts, client.WithNewSnapshot(key, e.img))
	case "":
		opts = append(opts, client.WithSnapshot(key))
	default:
		if _, err := e.sn.Prepare(e.ctx, key, parent); err != nil {
			t.Fatalf("preparing %s on %s: %v", key, parent, err)
		}
		opts = append(opts, client.WithSnapshot(key))
	}
	opts = append(opts, client.WithNewSpec(oci.WithImageConfig(e.img), oci.WithProcessArgs("true")))
	c, err := e.d.Client().NewContainer(e.ctx, id, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// run runs script as a task of c to completion and returns its output; the task is deleted, so
// the root filesystem is unmounted again.
func (e *fsEnv) run(t *testing.T, c client.Container, script string) string {
	t.Helper()
	spec, err := c.Spec(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	spec.Process.Args = []string{"sh", "-c", script}
	if err := c.Update(e.ctx, client.UpdateContainerOpts(client.WithSpec(spec))); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	task, err := c.NewTask(e.ctx, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr), cio.WithFIFODir(e.d.FIFODir())))
	if err != nil {
		t.Fatal(err)
	}
	exited, err := task.Wait(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	status := <-exited
	if _, err := task.Delete(e.ctx); err != nil {
		t.Fatal(err)
	}
	if status.ExitCode() != 0 {
		t.Fatalf("%q in %s exited %d: %s", script, c.ID(), status.ExitCode(), stderr.String())
	}
	return stdout.String()
}

func (e *fsEnv) freeze(t *testing.T, key, name string) time.Duration {
	t.Helper()
	start := time.Now()
	if err := freeze.Freeze(e.ctx, e.sn, nil, key, name, nil); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// TestSnapshotterPullRun unpacks and runs images on cklite with nerdctl and ctr, as a user would.
func TestSnapshotterPullRun(t *testing.T) {
	d := startDaemon(t, harness.Config{CkliteSnapshotter: true})
	nerdctl(t, d, "--snapshotter", ckliteSnapshotter, "pull", busyboxRef)
	if out := nerdctl(t, d, "--snapshotter", ckliteSnapshotter, "run", "--rm", "--net", "none", busyboxRef, "sh", "-c", "echo hello > /f && cat /f"); strings.TrimSpace(out) != "hello" {
		t.Fatalf("nerdctl run on cklite printed %q", out)
	}
	ctr(t, d, "images", "pull", "--hosts-dir", d.HostsDir, "--snapshotter", ckliteSnapshotter, busyboxRef)
	if out := ctrRun(t, d, "--rm", "--snapshotter", ckliteSnapshotter, busyboxRef, "ctr-on-cklite", "cat", "/etc/passwd"); !strings.Contains(out, "root:") {
		t.Fatalf("ctr run on cklite printed %q", out)
	}
	if out := ctr(t, d, "snapshots", "--snapshotter", ckliteSnapshotter, "ls"); !strings.Contains(out, "Committed") {
		t.Fatalf("ctr snapshots ls shows no unpacked layer:\n%s", out)
	}
}

// TestFreezeRollbackFork freezes a container's filesystem twice with changes in between, then
// rolls back to each freeze in new containers and forks 50 containers from the first: each must
// see exactly the files of its freeze (created, modified and deleted, i.e. whiteouts and opaque
// directories), and nothing any other one writes.
func TestFreezeRollbackFork(t *testing.T) {
	e := newFSEnv(t)
	c := e.container(t, "original", "original-rootfs", "image")

	state1 := e.run(t, c, `set -e
echo one > /created1
echo changed >> /etc/passwd
rm /bin/vi
mkdir -p /data/sub && echo f > /data/sub/f && echo g > /data/g
rm -rf /usr && mkdir /usr && echo fresh > /usr/only
`+listRootfs)
	t.Logf("freeze 1: %s", e.freeze(t, "original-rootfs", "freeze-1"))

	state2 := e.run(t, c, `set -e
test "$(cat /created1)" = one
echo two > /created1
echo b > /created2
rm /data/g
rm -rf /data/sub && mkdir /data/sub && echo n > /data/sub/n
rm -rf /usr && mkdir /usr
`+listRootfs)
	if state1 == state2 {
		t.Fatal("the second run changed nothing: the test would prove nothing")
	}
	t.Logf("freeze 2: %s", e.freeze(t, "original-rootfs", "freeze-2"))

	// containerd's metadata knows the frozen layers: ctr shows the chain.
	tree := ctr(t, e.d, "snapshots", "--snapshotter", ckliteSnapshotter, "tree")
	if i1, i2, ik := strings.Index(tree, "freeze-1"), strings.Index(tree, "freeze-2"), strings.Index(tree, "original-rootfs"); i1 < 0 || i2 < i1 || ik < i2 {
		t.Fatalf("ctr snapshots tree does not show image -> freeze-1 -> freeze-2 -> original-rootfs:\n%s", tree)
	}
	if got := e.run(t, c, listRootfs); got != state2 {
		t.Fatalf("after freeze 2 the original container sees another tree:\n%s", diffLines(state2, got))
	}
	if got := e.run(t, e.container(t, "rollback-1", "rollback-1", "freeze-1"), listRootfs); got != state1 {
		t.Fatalf("rollback to freeze 1 does not show its tree:\n%s", diffLines(state1, got))
	}
	if got := e.run(t, e.container(t, "rollback-2", "rollback-2", "freeze-2"), listRootfs); got != state2 {
		t.Fatalf("rollback to freeze 2 does not show its tree:\n%s", diffLines(state2, got))
	}

	// 50 forks of freeze 1, each writing its own file: running them one by one keeps the test
	// about the filesystem, not about how many runc tasks the machine runs at once.
	const forks = 50
	start := time.Now()
	for i := range forks {
		id := fmt.Sprintf("fork-%d", i)
		out := e.run(t, e.container(t, id, id, "freeze-1"), fmt.Sprintf(
			"cat /created1; echo %d > /mine; ls / | grep -c '^mine$'", i))
		if out != "one\n1\n" {
			t.Fatalf("fork %d printed %q, want the file of freeze 1 and only its own /mine", i, out)
		}
	}
	t.Logf("%d forks of one freeze created and run in %s", forks, time.Since(start))
	for i := range forks {
		key := fmt.Sprintf("fork-%d", i)
		if got := readSnapshotFile(t, e, key, "mine"); got != fmt.Sprintf("%d\n", i) {
			t.Fatalf("fork %d's /mine holds %q: forks are not independent", i, got)
		}
	}
	if got := e.run(t, e.container(t, "rollback-1-again", "rollback-1-again", "freeze-1"), listRootfs); got != state1 {
		t.Fatalf("freeze 1 changed after the forks wrote:\n%s", diffLines(state1, got))
	}
}

// readSnapshotFile reads name from a read-only view of the active snapshot key's current state.
func readSnapshotFile(t *testing.T, e *fsEnv, key, name string) string {
	t.Helper()
	mounts, err := e.sn.Mounts(e.ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	if err := mount.WithReadonlyTempMount(e.ctx, mounts, func(root string) error {
		got, err = os.ReadFile(filepath.Join(root, name))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return string(got)
}

// TestDeepChain freezes one container's filesystem 1000 times, changing it before each freeze,
// and checks that it still mounts with every change in place. It logs the mount latency by depth.
func TestDeepChain(t *testing.T) {
	const depth = 1000
	e := newFSEnv(t)
	c := e.container(t, "deep", "deep-rootfs", "image")
	mountAt := map[int]time.Duration{}
	dir := t.TempDir()
	for i := 1; i <= depth; i++ {
		mounts, err := e.sn.Mounts(e.ctx, "deep-rootfs")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := mount.All(mounts, dir); err != nil {
			t.Fatalf("mounting the rootfs after %d freezes: %v", i-1, err)
		}
		took := time.Since(start)
		if i-1 == 1 || i-1 == 100 || i-1 == depth-1 {
			mountAt[i-1] = took
		}
		// Each layer adds a file, rewrites /counter, and deletes the file of two layers before:
		// the final tree shows whether every layer, whiteouts included, is stacked in order.
		err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("layer-%d", i)), []byte("x"), 0o644)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "counter"), []byte(fmt.Sprint(i)), 0o644)
		}
		if err == nil && i > 2 {
			err = os.Remove(filepath.Join(dir, fmt.Sprintf("layer-%d", i-2)))
		}
		if err2 := mount.UnmountAll(dir, 0); err == nil {
			err = err2
		}
		if err != nil {
			t.Fatal(err)
		}
		e.freeze(t, "deep-rootfs", fmt.Sprintf("deep-%d", i))
	}
	mounts, err := e.sn.Mounts(e.ctx, "deep-rootfs")
	if err != nil {
		t.Fatal(err)
	}
	lowers := 0
	for _, o := range mounts[0].Options {
		if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			lowers = len(strings.Split(v, ":"))
		}
	}
	t.Logf("after %d freezes the rootfs mounts with %d lower directories", depth, lowers)
	if lowers > 128 {
		t.Fatalf("%d lower directories after %d freezes: deep chains are not merged", lowers, depth)
	}
	want := fmt.Sprintf("%d\nlayer-%d\nlayer-%d\n", depth, depth-1, depth)
	if got := e.run(t, c, "cat /counter; echo; ls / | grep '^layer-' | sort -t- -k2 -n"); got != want {
		t.Fatalf("after %d freezes the container sees %q, want %q", depth, got, want)
	}
	for _, d := range []int{1, 100, depth - 1} {
		t.Logf("mount latency at depth %d: %s", d, mountAt[d])
	}
}

// TestFrozenLayerGC checks that containerd's garbage collector keeps a frozen layer while
// something refers to it and removes it, from containerd and from cklite's disk, once released.
func TestFrozenLayerGC(t *testing.T) {
	e := newFSEnv(t)
	// Without the test's lease: only references keep what this test makes.
	ctx := e.d.Context(context.Background())
	c := e.container(t, "gc", "gc-rootfs", "image")
	e.run(t, c, "echo a > /a")
	if err := freeze.Freeze(ctx, e.sn, e.d.Client().LeasesService(), "gc-rootfs", "kept", map[string]string{"containerd.io/gc.root": "test"}); err != nil {
		t.Fatal(err)
	}
	e.run(t, c, "echo b > /b")
	if err := freeze.Freeze(ctx, e.sn, e.d.Client().LeasesService(), "gc-rootfs", "released", nil); err != nil {
		t.Fatal(err)
	}
	before := backendDirs(t, e.d)

	collectGarbage(t, e.d)
	for _, name := range []string{"kept", "released"} {
		if _, err := e.sn.Stat(ctx, name); err != nil {
			t.Fatalf("%s collected while the container's rootfs sits on it: %v", name, err)
		}
	}
	if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		t.Fatal(err)
	}
	collectGarbage(t, e.d)
	if _, err := e.sn.Stat(ctx, "kept"); err != nil {
		t.Fatalf("a frozen layer with a gc.root label was collected: %v", err)
	}
	if _, err := e.sn.Stat(ctx, "released"); !errdefs.IsNotFound(err) {
		t.Fatalf("a frozen layer nothing refers to was kept (stat: %v)", err)
	}
	if _, err := e.sn.Update(ctx, snapshots.Info{Name: "kept"}, "labels.containerd.io/gc.root"); err != nil {
		t.Fatal(err)
	}
	collectGarbage(t, e.d)
	if _, err := e.sn.Stat(ctx, "kept"); !errdefs.IsNotFound(err) {
		t.Fatalf("a released frozen layer was kept (stat: %v)", err)
	}
	if after := backendDirs(t, e.d); after != before-3 {
		t.Fatalf("cklite holds %d layer directories, want %d: the active and both frozen layers should be gone", after, before-3)
	}
}

// collectGarbage runs containerd's garbage collector to completion.
func collectGarbage(t *testing.T, d *harness.Daemon) {
	t.Helper()
	ctx := d.Context(context.Background())
	ls := d.Client().LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID())
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Delete(ctx, l, leases.SynchronousDelete); err != nil {
		t.Fatal(err)
	}
}

// backendDirs counts the snapshot directories cklite-snapshotter holds on disk.
func backendDirs(t *testing.T, d *harness.Daemon) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(d.Dir, "cklite-snapshotter", "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "m") {
			n++
		}
	}
	return n
}

// TestFreezeBadInput: each misuse fails with the error class and cause a caller can act on, and
// changes nothing.
func TestFreezeBadInput(t *testing.T) {
	e := newFSEnv(t)
	c := e.container(t, "bad", "bad-rootfs", "image")
	e.run(t, c, "echo a > /a")
	e.freeze(t, "bad-rootfs", "bad-frozen")
	for _, tc := range []struct {
		name    string
		do      func() error
		is      func(error) bool
		wantMsg string
	}{
		{"freeze a committed snapshot", func() error {
			err := freeze.Freeze(e.ctx, e.sn, nil, "bad-frozen", "x", nil)
			return err
		}, errdefs.IsFailedPrecondition, "only an active one"},
		{"freeze an unknown snapshot", func() error {
			err := freeze.Freeze(e.ctx, e.sn, nil, "no-such-key", "x", nil)
			return err
		}, errdefs.IsNotFound, "no-such-key"},
		{"freeze onto a name that exists", func() error {
			err := freeze.Freeze(e.ctx, e.sn, nil, "bad-rootfs", "bad-frozen", nil)
			return err
		}, errdefs.IsAlreadyExists, "bad-frozen"},
		{"prepare on a missing parent", func() error {
			_, err := e.sn.Prepare(e.ctx, "orphan", "no-such-parent")
			return err
		}, errdefs.IsNotFound, "no-such-parent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if err == nil || !tc.is(err) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("got %v, want an error of the right class mentioning %q", err, tc.wantMsg)
			}
		})
	}
	if got := e.run(t, c, "cat /a"); got != "a\n" {
		t.Fatalf("the container's files changed after refused operations: %q", got)
	}

	t.Run("freeze while the task runs", func(t *testing.T) {
		task, err := c.NewTask(e.ctx, cio.NullIO)
		if err != nil {
			t.Fatal(err)
		}
		defer task.Delete(e.ctx, client.WithProcessKill) //nolint:errcheck
		err = freeze.Freeze(e.ctx, e.sn, nil, "bad-rootfs", "while-mounted", nil)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "still mounted") {
			t.Fatalf("got %v, want a refusal naming the mount", err)
		}
		if _, err := e.sn.Stat(e.ctx, "bad-rootfs"); err != nil {
			t.Fatalf("the refused freeze lost the container's snapshot: %v", err)
		}
	})
}

// diffLines shows the lines only one of two listings has.
func diffLines(want, got string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var b strings.Builder
	for l := range w {
		if !g[l] {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for l := range g {
		if !w[l] {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}

// TestCheckpointDiffFastPath: the rw diff containerd computes for a checkpoint of a container on
// cklite comes from cklite's differ, which reads only the upper directory — the changes since the
// last freeze — and holds exactly those changes.
func TestCheckpointDiffFastPath(t *testing.T) {
	e := newFSEnv(t)
	c := e.container(t, "diffed", "diffed-rootfs", "image")
	e.run(t, c, "echo before > /before")
	e.freeze(t, "diffed-rootfs", "diffed-frozen")
	e.run(t, c, "echo after > /after; rm /before")

	ctr(t, e.d, "containers", "checkpoint", "--rw", "diffed", "checkpoint/diffed:1")
	img, err := e.d.Client().ImageService().Get(e.ctx, "checkpoint/diffed:1")
	if err != nil {
		t.Fatal(err)
	}
	index, err := content.ReadBlob(e.ctx, e.d.Client().ContentStore(), img.Target)
	if err != nil {
		t.Fatal(err)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(index, &idx); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, desc := range idx.Manifests {
		if !images.IsLayerType(desc.MediaType) { // the rw diff; the others are the spec and task images
			continue
		}
		ra, err := e.d.Client().ContentStore().ReaderAt(e.ctx, desc)
		if err != nil {
			t.Fatal(err)
		}
		defer ra.Close()
		r, err := compression.DecompressStream(content.NewReader(ra))
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, h.Name)
		}
	}
	sort.Strings(names)
	if want := []string{".wh.before", "after"}; !slices.Equal(names, want) {
		t.Fatalf("the checkpoint's rw diff holds %q, want %q (the changes since the freeze)", names, want)
	}
	log, err := os.ReadFile(filepath.Join(e.d.Dir, "cklite-snapshotter.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "cklite differ: diffed upperdir") {
		t.Fatal("the rw diff did not come from cklite's differ (no 'diffed upperdir' in cklite-snapshotter.log)")
	}
}
