package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/ckimage"
	"github.com/cklite/cklite/pkg/localimage"
)

// TestCRIRestore restores a pod from a checkpoint image with stock containerd's CRI, as the
// kubelet drives it: CheckpointContainer writes the kubelet's archive, `cklite checkpoint export`
// makes it an image and nerdctl pushes it; then CreateContainer + StartContainer of that image in
// a new pod with the cklite handler must bring back the checkpointed process and files, on the
// same containerd (twice: a fork) and on a second containerd that only pulls the image through
// CRI. With the runc handler the container must fail to start naming the missing runtime.
func TestCRIRestore(t *testing.T) {
	for _, tc := range []struct {
		mb     int
		bridge bool // pods on the CNI bridge, each in a network namespace of its own
	}{
		{0, false},
		{200, false},
		{0, true},
	} {
		name := fmt.Sprintf("%dMB", tc.mb)
		if tc.bridge {
			name += "-bridge"
		}
		t.Run(name, func(t *testing.T) { testCRIRestore(t, tc.mb, tc.bridge) })
	}
}

// testCRIRestore is TestCRIRestore with mb of random data written into the container's rootfs
// before the checkpoint, its pods on the host's network or (bridge) on a CNI bridge.
func testCRIRestore(t *testing.T, mb int, bridge bool) {
	d, cri := startCRI(t)
	if bridge {
		useBridge(t, cri)
	}
	ctx := criContext(t)
	_, id := runCounterPod(t, cri, "ck-source", harness.HandlerCklite, !bridge, false)
	c := newCounter(cri.RootfsPath(id))
	writeMarks(t, c.Rootfs, "cri")
	var data string
	if mb > 0 {
		if _, err := cri.Exec(ctx, id, "dd", "if=/dev/urandom", "of=/tmp/data", "bs=1M", fmt.Sprintf("count=%d", mb)); err != nil {
			t.Fatal(err)
		}
		data = fileDigest(t, c.Rootfs)
	}
	at := c.advance(t, 5)
	archive := checkpointPod(t, d, cri, id)
	changeMarks(t, c.Rootfs, "cri")
	c.advance(t, 3)
	ref := exportAndPush(t, d, cri, archive, "cri-checkpoint")
	expectRestored := func(t *testing.T, rc counter) {
		t.Helper()
		if mb > 0 {
			if got := fileDigest(t, rc.Rootfs); got != data {
				t.Fatalf("/tmp/data of the restored pod has digest %s, the checkpointed one %s", got, data)
			}
		}
		expectRolledBack(t, rc, at, "cri")
	}

	t.Run("same containerd", func(t *testing.T) {
		for _, name := range []string{"restored", "fork"} {
			expectRestored(t, restorePod(t, cri, name, harness.HandlerCklite, ref, !bridge))
		}
	})

	t.Run("runc refuses", func(t *testing.T) {
		_, _, err := startRestorePod(t, cri, "with-runc", harness.HandlerRunc, ref, !bridge)
		expectErrorNaming(t, err, ckimage.Marker)
	})

	t.Run("ctr run refuses: mounts", func(t *testing.T) {
		// ctr's spec lacks the bind mounts CRI gave the checkpointed container (/etc/hosts,
		// /dev/shm, ...), which CRIU dumped as external mounts and cannot restore without.
		r := ctrResult(t, d, "", "-n", harness.CRINamespace, "run", "-d", "--fifo-dir", d.FIFODir(), "--runtime", harness.CkliteRuntime, "--snapshotter", ckliteSnapshotter, ref, "with-ctr-"+randomTag())
		if r.code == 0 {
			t.Fatalf("ctr run of a CRI checkpoint image succeeded: %s", r.stdout)
		}
		expectErrorNaming(t, errors.New(r.stderr), "which this container lacks")
	})

	t.Run("another containerd", func(t *testing.T) {
		d2, cri2 := pullOnFreshNode(t, ref, bridge)
		// The archive alone cannot be exported here: the files are in the source's frozen layers.
		ckliteFails(t, d2, "frozen layer", "-n", harness.CRINamespace, "checkpoint", "export", "--ref", ref+"-again", archive)
		expectRestored(t, restorePod(t, cri2, "migrated", harness.HandlerCklite, ref, !bridge))
	})
}

// fileDigest is the digest of /tmp/data below rootfs.
func fileDigest(t *testing.T, rootfs string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(rootfs, "tmp", "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := digest.FromReader(f)
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// restorePod runs a pod named name with handler whose one container is the checkpoint image ref
// (its own entrypoint: the marker) and returns its counter.
func restorePod(t *testing.T, cri *harness.CRI, name, handler, ref string, hostNetwork bool) counter {
	t.Helper()
	pod, id, err := startRestorePod(t, cri, name, handler, ref, hostNetwork)
	if err != nil {
		t.Fatalf("restoring pod %s from %s: %v%s", name, ref, err, criuErrors(err))
	}
	if !hostNetwork {
		checkPodIP(t, cri, pod, id) // the restored process is in the new pod's network
	}
	return newCounter(cri.RootfsPath(id))
}

// startRestorePod is restorePod up to the start of the container, which it returns with the pod
// and the error of its creation or start; the pod goes when the test ends.
func startRestorePod(t *testing.T, cri *harness.CRI, name, handler, ref string, hostNetwork bool) (*harness.Pod, string, error) {
	t.Helper()
	ctx := criContext(t)
	start := time.Now()
	pod, err := cri.RunPod(ctx, name, handler, hostNetwork)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cri.RemovePod(context.Background(), pod); err != nil {
			t.Error(err)
		}
	})
	logTiming(t, "RunPodSandbox "+name, start)
	start = time.Now()
	id, err := cri.StartContainer(ctx, pod, pod.Container("restored", ref))
	if err == nil {
		logTiming(t, "pod restore (CreateContainer + StartContainer) "+name, start)
	}
	return pod, id, err
}

// checkpointPod checkpoints CRI container id with CheckpointContainer, as the kubelet does, and
// returns the archive.
func checkpointPod(t *testing.T, d *harness.Daemon, cri *harness.CRI, id string) string {
	t.Helper()
	archive := filepath.Join(d.Dir, "checkpoint-"+randomTag()+".tar")
	start := time.Now()
	if _, err := cri.Runtime.CheckpointContainer(criContext(t), &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: archive}); err != nil {
		t.Fatal(err)
	}
	logTiming(t, "CRI CheckpointContainer", start)
	return archive
}

// exportAndPush exports the checkpoint archive as an image of the registry's repository repo,
// pushes it with nerdctl and waits until CRI lists it.
func exportAndPush(t *testing.T, d *harness.Daemon, cri *harness.CRI, archive, repo string) string {
	t.Helper()
	ref := registry.Addr + "/cklite/" + repo + ":" + randomTag()
	start := time.Now()
	cklite(t, d, "-n", harness.CRINamespace, "checkpoint", "export", "--ref", ref, archive)
	logTiming(t, "cklite checkpoint export of the CRI archive", start)
	start = time.Now()
	nerdctl(t, d, "-n", harness.CRINamespace, "push", "--quiet", ref)
	logTiming(t, "nerdctl push of the checkpoint image", start)
	waitCRIImage(t, cri, ref)
	t.Logf("CRIU images: %d bytes compressed", criuBlob(t, d, ref).Size)
	return ref
}

// pullOnFreshNode starts a second containerd with nothing but the pause image and pulls checkpoint
// image ref through CRI, as a kubelet would; the node's shim extracts the CRIU blob into a cache of
// its own (its instance directory). bridge gives its pods a CNI bridge.
func pullOnFreshNode(t *testing.T, ref string, bridge bool) (*harness.Daemon, *harness.CRI) {
	t.Helper()
	ctx := criContext(t)
	d := startDaemon(t, harness.Config{CkliteSnapshotter: true})
	cri, err := d.CRI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cri.Close() })
	if bridge {
		useBridge(t, cri)
	}
	start := time.Now()
	if _, err := cri.Images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatal(err)
	}
	logTiming(t, "CRI PullImage of the checkpoint image, fresh containerd", start)
	return d, cri
}

// criuBlob is the CRIU image blob of checkpoint image ref in d's CRI namespace.
func criuBlob(t *testing.T, d *harness.Daemon, ref string) ocispec.Descriptor {
	t.Helper()
	ctx := namespaces.WithNamespace(criContext(t), harness.CRINamespace)
	img, err := d.Client().ImageService().Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := ckimage.Find(ctx, d.Client().ContentStore(), ref, img.Target, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	return ck.Blob
}

// waitCRIImage waits until the CRI plugin lists image ref, which it learns of from containerd's
// events.
func waitCRIImage(t *testing.T, cri *harness.CRI, ref string) {
	t.Helper()
	for range 200 {
		st, err := cri.Images.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		if err != nil {
			t.Fatal(err)
		}
		if st.GetImage() != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("CRI does not list %s 10s after its export", ref)
}

// pythonHolder starts a python3 child holding 256 MiB of random bytes (incompressible: the worst
// case for the checkpoint image), then runs the counter.
const pythonHolder = `python3 -c 'import os, time; b = bytearray(os.urandom(256 << 20)); open("/tmp/py", "w").write("holding"); time.sleep(1e9)' & ` +
	`while [ ! -e /tmp/py ]; do sleep 0.1; done; `

// TestCRIRestoreSandbox is TestCRIRestore's pod restore for the agent sandbox: Debian with
// python3, a python process holding 256 MiB, through the registry to a second containerd.
func TestCRIRestoreSandbox(t *testing.T) {
	ctx := criContext(t)
	sandbox, err := localimage.Sandbox(ctx, localimage.CacheDir(), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	d, cri := startCRI(t)
	if err := cri.ImportImage(ctx, sandbox); err != nil {
		t.Fatal(err)
	}
	pod, err := cri.RunPod(ctx, "sandbox-source", harness.HandlerCklite, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cri.RemovePod(context.Background(), pod) })
	id, err := cri.StartContainer(ctx, pod, pod.Container("agent", sandbox.Name, "sh", "-c", pythonHolder+workload.CounterScript))
	if err != nil {
		t.Fatal(err)
	}
	c := newCounter(cri.RootfsPath(id))
	writeMarkFiles(t, c.Rootfs, "sandbox")
	at := c.advance(t, 5)
	ref := exportAndPush(t, d, cri, checkpointPod(t, d, cri, id), "sandbox-checkpoint")
	expectAgent := func(t *testing.T, cri *harness.CRI, rc counter) {
		t.Helper()
		got, err := readMarks(rc.Rootfs)
		if err != nil || !maps.Equal(got, wantMarks("sandbox")) {
			t.Fatalf("marks of the restored pod: %v, %v; want %v", got, err, wantMarks("sandbox"))
		}
		rc.expectRestored(t, at)
	}

	expectAgent(t, cri, restorePod(t, cri, "sandbox-restored", harness.HandlerCklite, ref, true))
	// A fork finds the CRIU images extracted.
	expectAgent(t, cri, restorePod(t, cri, "sandbox-fork", harness.HandlerCklite, ref, true))

	_, cri2 := pullOnFreshNode(t, ref, false)
	expectAgent(t, cri2, restorePod(t, cri2, "sandbox-migrated", harness.HandlerCklite, ref, true))
}
