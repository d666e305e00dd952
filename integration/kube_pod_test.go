package integration

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cklite/cklite/integration/harness"
)

// duoManifest is TestCRIPodCheckpoint's pod as a kubelet runs it: the writer and the reader on
// cklite, sharing an emptyDir at /shared.
func duoManifest(t *testing.T) string {
	t.Helper()
	container := func(name, script string) map[string]any {
		return map[string]any{
			"name": name, "image": "localhost/cklite/busybox:latest", "imagePullPolicy": "Never",
			"command":      []string{"sh", "-c", script},
			"volumeMounts": []map[string]string{{"name": "shared", "mountPath": "/shared"}},
		}
	}
	m, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": map[string]string{"name": "duo"},
		"spec": map[string]any{
			"runtimeClassName": "cklite",
			"volumes":          []map[string]any{{"name": "shared", "emptyDir": map[string]any{}}},
			"containers":       []map[string]any{container("writer", podWriterScript), container("reader", podReaderScript)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(m)
}

// TestKubePodCheckpoint is TestCRIPodCheckpoint under a kubelet: `cklite pod checkpoint
// default/duo` on the node takes the two-container pod, with its emptyDir (found from the
// containers' mounts), at one instant; both run on and change; `cklite pod restore` brings the
// pod back in place, and the kubelet sees it as it was: Running, no container restarted, the same
// processes (tokens), the emptyDir, the writer's counter and the reader's count agreeing exactly.
func TestKubePodCheckpoint(t *testing.T) {
	_, cri, k := startKube(t)
	kubectl(t, k, "label", "node", harness.KubeNode, "cklite.io/runtime=true")
	if err := k.Apply(kubeContext(t), readFile(t, "../contrib/kubernetes/runtimeclass.yaml")); err != nil {
		t.Fatal(err)
	}
	runPod(t, k, "duo", duoManifest(t))
	ids := map[string]string{}
	for _, f := range strings.Fields(kubectl(t, k, "get", "pod", "duo", "-o", `jsonpath={range .status.containerStatuses[*]}{.name}={.containerID} {end}`)) {
		name, id, _ := strings.Cut(f, "=")
		ids[name] = strings.TrimPrefix(id, "containerd://")
	}
	uid := kubectl(t, k, "get", "pod", "duo", "-o", "jsonpath={.metadata.uid}")
	shared := filepath.Join(k.KubeletRoot, "pods", uid, "volumes", "kubernetes.io~empty-dir", "shared")
	p := duo{cri: cri, shared: shared, writer: ids["writer"], reader: ids["reader"]}
	before := p.waitRead(t, 20)

	id := strings.TrimSpace(ckliteCRI(t, cri, "pod", "checkpoint", "-q", "default/duo"))
	rec := podCheckpointRecord(t, cri, id)
	if len(rec.Members) != 2 || len(rec.Volumes) != 1 || rec.Volumes[0].HostPath != shared {
		t.Fatalf("pod checkpoint %s of the kubelet's pod records %+v, want 2 members and the emptyDir %s", id, rec, shared)
	}
	t.Logf("pod checkpoint %s: frozen %d ms", id, rec.FrozenMs)
	atCheckpoint := readSeq(t, filepath.Join(rec.CopyDir(rec.Volumes[0]), "seq"))
	p.waitRead(t, atCheckpoint+10)
	p.mark(t)

	ckliteCRI(t, cri, "pod", "restore", id)
	p.expectUnmarked(t)
	p.expectAgree(t, before, atCheckpoint)
	out := kubectl(t, k, "get", "pod", "duo", "-o", `jsonpath={.status.phase}{range .status.containerStatuses[*]} {.name}:{.restartCount}:{.ready}{end}`)
	if out != "Running writer:0:true reader:0:true" && out != "Running reader:0:true writer:0:true" {
		t.Errorf("the kubelet sees the restored pod as %q, want Running with both containers ready, never restarted", out)
	}
}
