package integration

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/localimage"
)

// The kubelet tests run a real one-node Kubernetes (harness.Kube: etcd, kube-apiserver,
// kube-controller-manager, kubelet) on a test containerd with the cklite runtime handler, from
// the binaries `make deps-kube` builds. `make test-kube` runs them; `make test` leaves them out
// (they need that longer install).

// kubeTimeout bounds one kubelet test.
const kubeTimeout = 10 * time.Minute

// startKube starts a daemon with cklite-snapshotter, its CRI with the busybox image and a bridge
// network, and a one-node cluster on it; all go when the test ends.
func startKube(t *testing.T) (*harness.Daemon, *harness.CRI, *harness.Kube) {
	t.Helper()
	d, cri := startCRI(t)
	useBridge(t, cri)
	k, err := d.StartKube(kubeContext(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range []string{"kubelet", "kube-apiserver"} {
				t.Logf("end of %s.log:\n%s", c, k.LogTail(c, 30))
			}
		}
		if err := k.Close(); err != nil {
			t.Error(err)
		}
	})
	return d, cri, k
}

func kubeContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	t.Cleanup(cancel)
	return ctx
}

func kubectl(t *testing.T, k *harness.Kube, args ...string) string {
	t.Helper()
	out, err := k.Kubectl(kubeContext(t), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// runPod applies manifest (one pod, in namespace default), places it on the node and waits until
// it runs; it returns the id of its first container.
func runPod(t *testing.T, k *harness.Kube, name, manifest string) string {
	t.Helper()
	ctx := kubeContext(t)
	if err := k.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	if err := k.Bind(ctx, "default", name); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := k.WaitPod(ctx, "default", name, "Running", 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, kubectl(t, k, "describe", "pod", name))
	}
	logTiming(t, "pod "+name+" bound to Running", start)
	id := kubectl(t, k, "get", "pod", name, "-o", "jsonpath={.status.containerStatuses[0].containerID}")
	return strings.TrimPrefix(id, "containerd://")
}

// podCount reads the pod's counter ("TOKEN N", contrib/kubernetes/pod.yaml) through kubectl exec.
func podCount(t *testing.T, k *harness.Kube, pod string) (string, int) {
	t.Helper()
	out := kubectl(t, k, "exec", pod, "--", "cat", "/tmp/count")
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("pod %s: /tmp/count is %q, want TOKEN N", pod, out)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("pod %s: /tmp/count is %q: %v", pod, out, err)
	}
	return f[0], n
}

// expectCounting fails the test unless pod's counter has token and advances past after.
func expectCounting(t *testing.T, k *harness.Kube, pod, token string, after int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tok, n := podCount(t, k, pod)
		if tok != token {
			t.Fatalf("pod %s counts with token %s, want %s: restarted rather than restored", pod, tok, token)
		}
		if n > after {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: counter stays at %d, want past %d", pod, n, after)
		}
		time.Sleep(500 * time.Millisecond) // the counter ticks once a second
	}
}

// expectUp fails the test unless pod runs with no container restarts.
func expectUp(t *testing.T, k *harness.Kube, pod string) {
	t.Helper()
	out := kubectl(t, k, "get", "pod", pod, "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].ready}")
	if out != "Running 0 true" {
		t.Errorf("pod %s: phase, restarts, ready = %q, want Running 0 true\n%s", pod, out, kubectl(t, k, "describe", "pod", pod))
	}
}

// docBlock returns the block of file that follows the line marker.
func docBlock(t *testing.T, file, marker string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), marker+"\n")
	if !ok {
		t.Fatalf("%s has no %q", file, marker)
	}
	rest = strings.TrimPrefix(rest, "```yaml\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("%s: the block after %q does not end", file, marker)
	}
	return block
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestKubeRuntimeClass follows docs/kubernetes.md on a real kubelet with contrib/kubernetes's
// files as they are: label the node, apply the RuntimeClass and the counter pod, exec and logs;
// checkpoint it through the kubelet's checkpoint API, export the archive as a checkpoint image and
// push it; restore it as a new pod with the docs' restore YAML and fork a second one (same
// counter token, counting on from the checkpoint); both keep running across a kubelet restart, a
// containerd restart and a minute (the kubelet has been reported to kill restored containers:
// containerd #12108, #9691); a pod of the image without the cklite RuntimeClass is refused
// with the image's marker; deleting the pods removes their containers.
func TestKubeRuntimeClass(t *testing.T) {
	d, cri, k := startKube(t)
	ctx := kubeContext(t)
	kubectl(t, k, "label", "node", harness.KubeNode, "cklite.io/runtime=true")
	if err := k.Apply(ctx, readFile(t, "../contrib/kubernetes/runtimeclass.yaml")); err != nil {
		t.Fatal(err)
	}
	id := runPod(t, k, "agent", readFile(t, "../contrib/kubernetes/pod.yaml"))
	checkRuntime(t, d, cri, id, harness.CkliteRuntime, "cklite")
	token, before := podCount(t, k, "agent")
	logs := kubectl(t, k, "logs", "agent")
	if !strings.Contains(logs, token+" 1\n") {
		t.Errorf("kubectl logs agent: %q, want the counter's lines from %s 1", logs, token)
	}

	start := time.Now()
	archive, err := k.Checkpoint(ctx, "default", "agent", "agent")
	if err != nil {
		t.Fatal(err)
	}
	logTiming(t, "kubelet checkpoint API", start)
	if _, ok := readArchive(t, archive)["checkpoint/cklite.json"]; !ok {
		t.Fatalf("the kubelet's archive %s has no checkpoint/cklite.json: not a cklite checkpoint", archive)
	}
	expectCounting(t, k, "agent", token, before) // left running
	ref := exportAndPush(t, d, cri, archive, "agent")

	restore := docBlock(t, "../docs/kubernetes.md", "<!-- kube: restore pod -->")
	if !strings.Contains(restore, "REG/app:ck1") || !strings.Contains(restore, "agent-fork-1") {
		t.Fatalf("docs/kubernetes.md's restore YAML changed: %q", restore)
	}
	restored := time.Now()
	forks := []string{"agent-fork-1", "agent-fork-2"}
	counts := map[string]int{}
	for _, name := range forks {
		manifest := strings.NewReplacer("REG/app:ck1", ref, "agent-fork-1", name).Replace(restore)
		fid := runPod(t, k, name, manifest)
		checkRuntime(t, d, cri, fid, harness.CkliteRuntime, "cklite")
		counts[name] = expectCounting(t, k, name, token, before)
	}

	if err := k.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range forks {
		expectUp(t, k, name)
		counts[name] = expectCounting(t, k, name, token, counts[name])
	}
	if err := d.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The kubelet sees containerd back through CRI's status, then syncs the pods again.
	if err := k.WaitPod(ctx, "default", forks[0], "Running", time.Minute); err != nil {
		t.Fatal(err)
	}
	if wait := time.Minute - time.Since(restored); wait > 0 {
		t.Logf("waiting %s: the restored pods must still run a minute after their restore", wait.Round(time.Second))
		time.Sleep(wait)
	}
	for _, name := range append(forks, "agent") {
		expectUp(t, k, name)
	}
	for _, name := range forks {
		expectCounting(t, k, name, token, counts[name])
	}

	refused := strings.NewReplacer("REG/app:ck1", ref, "agent-fork-1", "agent-on-runc", "  runtimeClassName: cklite\n", "").Replace(restore)
	if err := k.Apply(ctx, refused); err != nil {
		t.Fatal(err)
	}
	if err := k.Bind(ctx, "default", "agent-on-runc"); err != nil {
		t.Fatal(err)
	}
	const marker = "cklite-checkpoint-image:requires-runtime-io.containerd.cklite.v2"
	deadline := time.Now().Add(time.Minute)
	for {
		state := kubectl(t, k, "get", "pod", "agent-on-runc", "-o", "jsonpath={.status.containerStatuses[0].state} {.status.containerStatuses[0].lastState}")
		if strings.Contains(state, marker) {
			break
		}
		if strings.Contains(state, "running") || time.Now().After(deadline) {
			t.Fatalf("a runc pod of the checkpoint image: state %s, want a failure naming %s", state, marker)
		}
		time.Sleep(time.Second)
	}

	// kubectl waits until the kubelet has stopped the pod's containers; it removes them later.
	kubectl(t, k, "delete", "pod", "agent", "--timeout=60s")
	if st, err := cri.ContainerState(ctx, id); err == nil && st == runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("container %s of the deleted pod still runs", id)
	}
}

// TestKubeSandbox is the agent sandbox under a kubelet: a pod of the Debian + python3 image on
// cklite, python holding 256 MiB beside the counter, checkpointed through the kubelet's API,
// exported and pushed, and restored on the same node as a new pod with the docs' restore YAML:
// the counter counts on with its token, the files are as checkpointed, and the kubelet sees the
// pod Running with no restart. (The kubelet's service account volume is at
// /var/run/secrets/..., which Debian's /var/run -> /run symlink resolves to /run/secrets/...:
// the restore admits it as the spec's bind mount.)
func TestKubeSandbox(t *testing.T) {
	d, cri, k := startKube(t)
	ctx := kubeContext(t)
	sandbox, err := localimage.Sandbox(ctx, localimage.CacheDir(), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if err := cri.ImportImage(ctx, sandbox); err != nil {
		t.Fatal(err)
	}
	kubectl(t, k, "label", "node", harness.KubeNode, "cklite.io/runtime=true")
	if err := k.Apply(ctx, readFile(t, "../contrib/kubernetes/runtimeclass.yaml")); err != nil {
		t.Fatal(err)
	}
	manifest, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": map[string]string{"name": "sandbox"},
		"spec": map[string]any{
			"runtimeClassName": "cklite",
			"containers": []map[string]any{{
				"name": "agent", "image": sandbox.Name, "imagePullPolicy": "Never",
				"command": []string{"sh", "-c", pythonHolder + workload.CounterScript},
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := runPod(t, k, "sandbox", string(manifest))
	c := newCounter(cri.RootfsPath(id))
	writeMarkFiles(t, c.Rootfs, "sandbox")
	at := c.advance(t, 5)
	start := time.Now()
	archive, err := k.Checkpoint(ctx, "default", "sandbox", "agent")
	if err != nil {
		t.Fatal(err)
	}
	logTiming(t, "kubelet checkpoint API, 256 MiB", start)
	ref := exportAndPush(t, d, cri, archive, "sandbox")

	restore := strings.NewReplacer("REG/app:ck1", ref, "agent-fork-1", "sandbox-restored").
		Replace(docBlock(t, "../docs/kubernetes.md", "<!-- kube: restore pod -->"))
	rid := runPod(t, k, "sandbox-restored", restore)
	rc := newCounter(cri.RootfsPath(rid))
	if got, err := readMarks(rc.Rootfs); err != nil || !maps.Equal(got, wantMarks("sandbox")) {
		t.Fatalf("marks of the restored pod: %v, %v; want %v", got, err, wantMarks("sandbox"))
	}
	rc.expectRestored(t, at)
	expectUp(t, k, "sandbox-restored")
}
