package integration

// TestCheckpointImage holds checkpoint images (pkg/ckimage) to their promise: a checkpoint
// exported as an OCI image travels through a registry or an archive like any image, and a
// container created from it with the cklite runtime is the checkpointed process, memory and
// files, on the same containerd and on another one that has only pulled the image; with any other
// runtime, or from a damaged image, it fails naming why.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/ckimage"
)

func TestCheckpointImage(t *testing.T) {
	e := newCkEnv(t)
	_, task, c := e.startCounter(t, "original")
	// Two checkpoints, the second on the first: a chain of two frozen layers.
	_, m1, _ := e.markedCheckpoint(t, task, c, "ck1")
	changeMarks(t, c.Rootfs, "ck1")
	_, m2, at := e.markedCheckpoint(t, task, c, "ck2")
	changeMarks(t, c.Rootfs, "ck2")
	e.expectParent(t, m2, m1)

	ref := registry.Addr + "/cklite/checkpoint:" + m2.ID
	archive := filepath.Join(e.d.Dir, "checkpoint.tar")
	start := time.Now()
	cklite(t, e.d, "checkpoint", "export", "--ref", ref, "-o", archive, m2.ID)
	logTiming(t, "cklite checkpoint export (2 frozen layers, + OCI archive)", start)
	img, blob := e.expectCheckpointImage(t, ref, 2)
	start = time.Now()
	nerdctl(t, e.d, "push", "--quiet", ref)
	logTiming(t, "nerdctl push of the checkpoint image", start)

	t.Run("same containerd", func(t *testing.T) {
		unpack(t, e, img)
		start := time.Now()
		rc := e.restoreFromImage(t, "same-node", img)
		logTiming(t, "create + start from the checkpoint image, same containerd", start)
		expectRolledBack(t, rc, at, "ck2")

		// The image's cklite.json names original's checkpoints (its id and lineage): they are
		// input from outside, and same-node descends from none of them.
		restored, err := e.d.Client().LoadContainer(e.ctx, "same-node")
		if err != nil {
			t.Fatal(err)
		}
		labels, err := restored.Labels(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := labels[checkpoint.LineageKey]; got != "" || m2.Lineage != m1.ID {
			t.Fatalf("same-node's lineage is %q after its restore from an image of %s (lineage %q), want none", got, m2.ID, m2.Lineage)
		}
		for _, k := range []string{m1.ID, m2.ID} {
			ckliteFails(t, e.d, "checkpoint "+k+" was taken of container original", "rollback", "same-node", k)
		}

		// The restored container checkpoints and exports like any: a third delta on the image.
		rtask, err := restored.Task(e.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, m4, at4 := e.markedCheckpoint(t, rtask, rc, "ck4")
		ref4 := registry.Addr + "/cklite/checkpoint:" + m4.ID
		cklite(t, e.d, "checkpoint", "export", "--ref", ref4, m4.ID)
		img4, _ := e.expectCheckpointImage(t, ref4, 3)
		unpack(t, e, img4)
		expectRolledBack(t, e.restoreFromImage(t, "re-restored", img4), at4, "ck4")
	})

	t.Run("fork", func(t *testing.T) {
		var forks []counter
		for _, id := range []string{"fork-1", "fork-2"} {
			forks = append(forks, e.restoreFromImage(t, id, img))
		}
		for _, f := range forks {
			expectMarks(t, f.Rootfs, "ck2")
			f.waitFor(t, "the fork at the checkpoint", func(x workload.Count) bool { return x == at })
		}
		// Each counts on alone.
		got := forks[0].advance(t, 3)
		if x := forks[1].waitFor(t, "a count", func(workload.Count) bool { return true }); x != at || got.Token != at.Token {
			t.Fatalf("fork 1 counted to %+v, fork 2 is at %+v: want fork 2 still at %+v", got, x, at)
		}
	})

	t.Run("runc refuses", func(t *testing.T) {
		unpack(t, e, img, "overlayfs")
		rc, err := e.d.Client().NewContainer(e.ctx, "with-runc",
			client.WithNewSnapshot("with-runc", img),
			client.WithRuntime("io.containerd.runc.v2", nil),
			client.WithNewSpec(oci.WithImageConfig(img)))
		if err != nil {
			t.Fatal(err)
		}
		_, err = startTask(e.ctx, rc)
		expectErrorNaming(t, err, ckimage.Marker)
	})

	t.Run("another containerd", func(t *testing.T) {
		other := otherCkEnv(t)
		other.clearCache(t, blob)
		start := time.Now()
		nerdctl(t, other.d, "--snapshotter", ckliteSnapshotter, "pull", "--quiet", ref)
		logTiming(t, "nerdctl pull of the checkpoint image, fresh containerd", start)
		pulled, err := other.d.Client().GetImage(other.ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		rc := other.restoreFromImage(t, "migrated", pulled)
		logTiming(t, "create + start from the pulled checkpoint image", start)
		expectRolledBack(t, rc, at, "ck2")

		// The archive brings the same image.
		if err := other.d.Client().ImageService().Delete(other.ctx, ref); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		cklite(t, other.d, "checkpoint", "import", "--snapshotter", ckliteSnapshotter, archive)
		logTiming(t, "cklite checkpoint import of the OCI archive", start)
		imported, err := other.d.Client().GetImage(other.ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if imported.Target().Digest != img.Target().Digest {
			t.Fatalf("the archive holds manifest %s, the exported image is %s", imported.Target().Digest, img.Target().Digest)
		}
		expectRolledBack(t, other.restoreFromImage(t, "imported", imported), at, "ck2")

		// ctr's default spec is the Go client's: the same mounts as the checkpointed container.
		start = time.Now()
		ctr(t, other.d, "run", "-d", "--fifo-dir", other.d.FIFODir(), "--runtime", harness.CkliteRuntime, "--snapshotter", ckliteSnapshotter, ref, "ctr-run")
		logTiming(t, "ctr run -d of the checkpoint image", start)
		expectRolledBack(t, newCounter(other.d.RootfsPath("ctr-run")), at, "ck2")

		// nerdctl's spec has a seccomp filter, which the checkpointed container (the Go client's
		// spec) had not: restored as they were dumped, its processes would run without the filter
		// the spec asks for, so the image is refused (docs/security.md) and the task not made.
		run := []string{"run", "-d", "--runtime", harness.CkliteRuntime, "--snapshotter", ckliteSnapshotter, "--net", "none"}
		if r := nerdctlResult(t, other.d, "", append(run, "--name", "filtered", ref)...); r.code == 0 || !strings.Contains(r.stderr, "seccomp") {
			t.Fatalf("nerdctl run with a seccomp filter the checkpoint did not have: exit %d, %s", r.code, r.stderr)
		}
		// nerdctl adds bind mounts the checkpointed container did not have (/etc/hosts,
		// /etc/resolv.conf, /etc/hostname): CRIU restores the mounts it dumped and ignores them.
		start = time.Now()
		id := strings.TrimSpace(nerdctl(t, other.d, append(run, "--security-opt", "seccomp=unconfined", ref)...))
		logTiming(t, "nerdctl run -d of the checkpoint image", start)
		expectRolledBack(t, newCounter(other.d.RootfsPath(id)), at, "ck2")
	})

	t.Run("ctr checkpoint image", func(t *testing.T) {
		writeMarks(t, c.Rootfs, "ck3")
		at3 := c.advance(t, 3)
		mustCtr(t, e.d, "containers", "checkpoint", "--task", "original", "checkpoint/original:ck3")
		ref3 := registry.Addr + "/cklite/checkpoint:ctr-" + randomTag()
		cklite(t, e.d, "checkpoint", "export", "--ref", ref3, "checkpoint/original:ck3")
		img3, _ := e.expectCheckpointImage(t, ref3, 3)
		unpack(t, e, img3)
		expectRolledBack(t, e.restoreFromImage(t, "from-ctr", img3), at3, "ck3")
	})

	t.Run("foreign image", func(t *testing.T) {
		rc := e.newContainer(t, "foreign", e.img, oci.WithProcessArgs(ckimage.Marker))
		_, err := e.restore(rc, nil)
		expectErrorNaming(t, err, "is not a cklite checkpoint image")
	})

	// Last: they damage the blob in the content store.
	blobPath := filepath.Join(e.d.Root, "io.containerd.content.v1.content", "blobs", "sha256", blob.Digest.Encoded())
	for _, tc := range []struct {
		name   string
		damage func() error
		want   string
	}{
		{"truncated CRIU images", func() error { return os.Truncate(blobPath, blob.Size/2) }, "are corrupt"},
		{"missing CRIU images", func() error { return os.Remove(blobPath) }, "are not in the content store"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.clearCache(t, blob)
			if err := tc.damage(); err != nil {
				t.Fatal(err)
			}
			rc := e.newContainer(t, "damaged-"+strings.Fields(tc.name)[0], img)
			_, err := e.restore(rc, nil)
			expectErrorNaming(t, err, tc.want)
		})
	}
}

// otherCkEnv is a second containerd with cklite-snapshotter and nothing imported.
func otherCkEnv(t *testing.T) *ckEnv {
	t.Helper()
	d := startDaemon(t, harness.Config{CkliteSnapshotter: true})
	ctx, cancel := context.WithTimeout(d.Context(context.Background()), ckTimeout)
	t.Cleanup(cancel)
	return &ckEnv{d: d, sn: d.Client().SnapshotService(ckliteSnapshotter), lm: d.Client().LeasesService(), ctx: ctx}
}

// expectCheckpointImage checks the image ref is a checkpoint image on busybox with deltas delta
// layers, and returns it with its CRIU blob.
func (e *ckEnv) expectCheckpointImage(t *testing.T, ref string, deltas int) (client.Image, ocispec.Descriptor) {
	t.Helper()
	img, err := e.d.Client().GetImage(e.ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	cs := e.d.Client().ContentStore()
	m, err := images.Manifest(e.ctx, cs, img.Target(), platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	base, err := images.Manifest(e.ctx, cs, e.img.Target(), platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != len(base.Layers)+deltas+1 {
		t.Fatalf("checkpoint image has %d manifest entries, want busybox's %d layers, %d deltas and the CRIU images", len(m.Layers), len(base.Layers), deltas)
	}
	for i, l := range base.Layers {
		if m.Layers[i].Digest != l.Digest {
			t.Fatalf("layer %d of the checkpoint image is %s, busybox's is %s: the base layers must be reused", i, m.Layers[i].Digest, l.Digest)
		}
	}
	blob := m.Layers[len(m.Layers)-1]
	if blob.MediaType != ckimage.MediaTypeCheckpoint {
		t.Fatalf("the last manifest entry is a %s, want %s", blob.MediaType, ckimage.MediaTypeCheckpoint)
	}
	var cfg ocispec.Image
	data, err := content.ReadBlob(e.ctx, cs, m.Config)
	if err == nil {
		err = json.Unmarshal(data, &cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.RootFS.DiffIDs) != len(base.Layers)+deltas || !ckimage.IsMarker(cfg.Config.Entrypoint) {
		t.Fatalf("checkpoint image config: %d diff ids, entrypoint %q; want %d and %s", len(cfg.RootFS.DiffIDs), cfg.Config.Entrypoint, len(base.Layers)+deltas, ckimage.Marker)
	}
	t.Logf("checkpoint image %s: %d layers, CRIU images %d bytes", ref, len(m.Layers)-1, blob.Size)
	return img, blob
}

// restoreFromImage creates container id from the checkpoint image img with the cklite runtime
// and starts it: the process of the checkpoint must come back.
func (e *ckEnv) restoreFromImage(t *testing.T, id string, img client.Image) counter {
	t.Helper()
	// The shim's extracted copy is in the daemon's directory (its cklite state directory), removed
	// with it.
	rc := e.newContainer(t, id, img)
	if _, err := e.restore(rc, nil); err != nil {
		t.Fatalf("restoring %s from checkpoint image %s: %v%s", id, img.Name(), err, criuErrors(err))
	}
	return newCounter(e.d.RootfsPath(id))
}

// unpack unpacks img into snapshotter (default cklite).
func unpack(t *testing.T, e *ckEnv, img client.Image, snapshotter ...string) {
	t.Helper()
	sn := ckliteSnapshotter
	if len(snapshotter) > 0 {
		sn = snapshotter[0]
	}
	start := time.Now()
	if err := img.Unpack(e.ctx, sn); err != nil {
		t.Fatalf("unpacking %s into %s: %v", img.Name(), sn, err)
	}
	logTiming(t, "unpack of the checkpoint image into "+sn, start)
}

// clearCache removes the shim's extracted copies of chain (a checkpoint image's CRIU blobs, bottom
// first: each directory of the chain) from the daemon's cache, so that the next restore extracts
// them.
func (e *ckEnv) clearCache(t *testing.T, chain ...ocispec.Descriptor) {
	t.Helper()
	inst, err := e.d.Instance(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range chain {
		if err := os.RemoveAll(ckimage.CacheDir(inst.ImageCache(), chain[:i+1])); err != nil {
			t.Fatal(err)
		}
	}
}
