package integration

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/checkpoint"
)

// criArchiveFiles are what containerd's CheckpointContainer writes into the kubelet's archive
// besides the CRIU images under checkpoint/.
var criArchiveFiles = []string{"rootfs-diff.tar", "spec.dump", "config.dump", "status.dump", "container.log"}

// TestCRICheckpointContainer checkpoints a running counter through CRI's CheckpointContainer (what
// the kubelet's checkpoint API calls) with each handler, idle and with 200 MB written into the
// container before each checkpoint, three times. Each archive must hold what containerd writes; the
// container must run on with the same process (token and count). cklite's CRIU directory must carry
// cklite.json naming a frozen layer that holds the written data, stacked on the previous
// checkpoint's, so that its rootfs-diff.tar stays empty: the filesystem half cost no walk of the
// rootfs while the container was paused. runc's diff holds the data. A pod on the CNI bridge keeps
// its address; in a pod sharing its PID namespace (shareProcessNamespace), where the restore needs
// the dumped pids back, the pause process reaps the killed ones first.
func TestCRICheckpointContainer(t *testing.T) {
	d, cri := startCRI(t)
	useBridge(t, cri)
	for _, tc := range []struct {
		handler           string
		mb                int
		bridge, sharedPID bool
	}{
		{harness.HandlerCklite, 0, false, false},
		{harness.HandlerCklite, 0, true, false},
		{harness.HandlerCklite, 0, false, true},
		{harness.HandlerCklite, 200, false, false},
		{harness.HandlerRunc, 0, false, false},
		{harness.HandlerRunc, 200, false, false},
	} {
		name := fmt.Sprintf("%s-%dMB", tc.handler, tc.mb)
		if tc.bridge {
			name += "-bridge"
		}
		if tc.sharedPID {
			name += "-sharedpid"
		}
		t.Run(name, func(t *testing.T) {
			ctx := criContext(t)
			pod, id := runCounterPod(t, cri, "ck-"+name, tc.handler, !tc.bridge, tc.sharedPID)
			c := newCounter(cri.RootfsPath(id))
			var times []time.Duration
			var parent string
			for round := range 3 {
				if tc.mb > 0 {
					if _, err := cri.Exec(ctx, id, "dd", "if=/dev/urandom", "of=/tmp/data", "bs=1M", fmt.Sprintf("count=%d", tc.mb)); err != nil {
						t.Fatal(err)
					}
				}
				at := c.advance(t, 5)

				archive := filepath.Join(d.Dir, fmt.Sprintf("%s-%d.tar", pod.Config.GetMetadata().GetName(), round))
				start := time.Now()
				if _, err := cri.Runtime.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: archive}); err != nil {
					t.Fatal(err)
				}
				times = append(times, time.Since(start))

				files := readArchive(t, archive)
				for _, entry := range append([]string{"checkpoint/inventory.img"}, criArchiveFiles...) {
					if _, ok := files[entry]; !ok {
						t.Errorf("archive has no %s", entry)
					}
				}
				diffMB := int(files["rootfs-diff.tar"].size >> 20)
				if tc.handler == harness.HandlerCklite {
					meta := checkCkliteMeta(t, d, cri, files["checkpoint/"+checkpoint.MetaFile], id, tc.mb)
					if meta.Parent != parent {
						t.Errorf("checkpoint %d: parent %q, want the previous one, %q", round, meta.Parent, parent)
					}
					parent = meta.ID
					if diffMB > 0 {
						t.Errorf("rootfs-diff.tar holds %d MB: the diff walked the frozen data", diffMB)
					}
				} else if diffMB < tc.mb*9/10 {
					t.Errorf("runc's rootfs-diff.tar holds %d MB, want the %d MB written", diffMB, tc.mb)
				}

				if st, err := cri.ContainerState(ctx, id); err != nil || st != runtimeapi.ContainerState_CONTAINER_RUNNING {
					t.Fatalf("after checkpoint %d: state %v, %v; want RUNNING", round, st, err)
				}
				c.expectRestored(t, at)
				if tc.bridge {
					checkPodIP(t, cri, pod, id)
				}
			}
			slices.Sort(times)
			t.Logf("timing: CRI CheckpointContainer, %s: median %v of %v", name, times[len(times)/2].Round(time.Millisecond), times)
		})
	}
}

// TestCRICheckpointErrors checks that refused CRI checkpoints say why, and leave a running
// container running; a running ExecSync is no reason to refuse.
func TestCRICheckpointErrors(t *testing.T) {
	d, cri := startCRI(t)
	ctx := criContext(t)
	pod, running := runCounterPod(t, cri, "ck-errors", harness.HandlerCklite, true, false)
	stopped, err := cri.StartContainer(ctx, pod, pod.Container("stopped", busybox.Name, "true"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cri.WaitContainerState(ctx, stopped, runtimeapi.ContainerState_CONTAINER_EXITED, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	c := newCounter(cri.RootfsPath(running))
	at := c.advance(t, 2)
	// An exec'd process (an exec liveness probe running at the kubelet's checkpoint) is in the
	// init's process tree CRIU dumps: the checkpoint takes it, and it runs on, through the
	// refused checkpoints too, until released; ExecSync then returns.
	release := filepath.Join(cri.RootfsPath(running), "tmp", "release")
	execDone := make(chan error, 1)
	go func() {
		_, err := cri.Exec(ctx, running, "sh", "-c", "while [ ! -e /tmp/release ]; do sleep 0.1; done")
		execDone <- err
	}()
	eventually(t, "the exec to run", func() error {
		out, err := cri.Exec(ctx, running, "ps", "-o", "args")
		if err == nil && !strings.Contains(out, "/tmp/release") {
			err = fmt.Errorf("not in ps: %s", out)
		}
		return err
	})
	withExec := filepath.Join(d.Dir, "with-exec.tar")
	if _, err := cri.Runtime.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: running, Location: withExec}); err != nil {
		t.Fatalf("checkpoint while an exec runs: %v", err)
	}

	for _, tc := range []struct {
		name, id, want string
	}{
		{"stopped", stopped, "only CONTAINER_RUNNING containers can be checkpointed"},
		{"unknown", "no-such-container", "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			archive := filepath.Join(d.Dir, "refused-"+strings.ReplaceAll(tc.name, " ", "-")+".tar")
			_, err := cri.Runtime.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: tc.id, Location: archive})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkpoint of %s: %v, want an error saying %q", tc.name, err, tc.want)
			}
			if _, err := os.Stat(archive); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a refused checkpoint left %s (%v)", archive, err)
			}
		})
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-execDone; err != nil {
		t.Errorf("the exec running during the checkpoints: %v", err)
	}
	if st, err := cri.ContainerState(ctx, running); err != nil || st != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("after the refused checkpoints: state %v, %v; want RUNNING", st, err)
	}
	expectContinues(t, c, at) // the same process, counting on
}

// runCounterPod runs a pod with the handler whose one container runs the counter workload after a
// line on stdout (so its container.log is not empty); sharedPID shares the pod's PID namespace
// among its containers and the pause process.
// runAnnotatedSleeper runs a pod with annotations on the cklite handler (host network) and in it a
// container running busybox `sleep`; it returns the pod and the container's id.
func runAnnotatedSleeper(t *testing.T, cri *harness.CRI, name string, annotations map[string]string) (*harness.Pod, string) {
	t.Helper()
	ctx := criContext(t)
	cfg, err := cri.PodConfig(name, true)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Annotations = annotations
	pod, err := cri.RunPodConfig(ctx, cfg, harness.HandlerCklite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cri.RemovePod(context.Background(), pod); err != nil {
			t.Error(err)
		}
	})
	id, err := cri.StartContainer(ctx, pod, pod.Container("sleeper", busybox.Name, "sleep", "1000000"))
	if err != nil {
		t.Fatal(err)
	}
	return pod, id
}

func runCounterPod(t *testing.T, cri *harness.CRI, name, handler string, hostNetwork, sharedPID bool) (*harness.Pod, string) {
	t.Helper()
	ctx := criContext(t)
	cfg, err := cri.PodConfig(name, hostNetwork)
	if err != nil {
		t.Fatal(err)
	}
	if sharedPID {
		cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().Pid = runtimeapi.NamespaceMode_POD
	}
	pod, err := cri.RunPodConfig(ctx, cfg, handler)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cri.RemovePod(context.Background(), pod); err != nil {
			t.Error(err)
		}
	})
	id, err := cri.StartContainer(ctx, pod, pod.Container("counter", busybox.Name, "sh", "-c", "echo counting; "+workload.CounterScript))
	if err != nil {
		t.Fatal(err)
	}
	return pod, id
}

type archiveFile struct {
	size int64
	data []byte // of small files only
}

// readArchive returns the regular files of a checkpoint archive by name, with the contents of
// those under 1 MiB.
func readArchive(t *testing.T, path string) map[string]archiveFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string]archiveFile{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("reading %s: %v", path, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		af := archiveFile{size: hdr.Size}
		if hdr.Size < 1<<20 {
			if af.data, err = io.ReadAll(tr); err != nil {
				t.Fatalf("reading %s from %s: %v", hdr.Name, path, err)
			}
		}
		files[strings.TrimPrefix(hdr.Name, "/")] = af
	}
}

// checkCkliteMeta checks the archive's cklite.json records a memory+fs checkpoint of container id
// whose frozen layer exists in containerd and holds at least the mb written.
func checkCkliteMeta(t *testing.T, d *harness.Daemon, cri *harness.CRI, f archiveFile, id string, mb int) checkpoint.Meta {
	t.Helper()
	var meta checkpoint.Meta
	if err := json.Unmarshal(f.data, &meta); err != nil {
		t.Fatalf("checkpoint/%s in the archive: %v", checkpoint.MetaFile, err)
	}
	if meta.Container != id || meta.Namespace != harness.CRINamespace || meta.Contents != checkpoint.MemoryAndFS || meta.Frozen == "" {
		t.Fatalf("%s records %+v, want a memory+fs checkpoint of %s/%s with a frozen layer", checkpoint.MetaFile, meta, harness.CRINamespace, id)
	}
	usage, err := d.Client().SnapshotService(meta.Snapshotter).Usage(cri.Context(criContext(t)), meta.Frozen)
	if err != nil {
		t.Fatalf("frozen layer %s of %s: %v", meta.Frozen, checkpoint.MetaFile, err)
	}
	if int(usage.Size>>20) < mb {
		t.Errorf("frozen layer %s holds %d bytes, want the %d MB written", meta.Frozen, usage.Size, mb)
	}
	// The kubelet keeps no record of checkpoints; cklite lists them from their leases.
	ids, err := cri.Cklite(criContext(t), "checkpoint", "ls", "-q")
	if err != nil || !slices.Contains(strings.Fields(ids), meta.ID) {
		t.Errorf("cklite checkpoint ls -q in %s: %q, %v; want %s listed", harness.CRINamespace, ids, err, meta.ID)
	}
	return meta
}

// TestCRICheckpointPodAnnotations checks that cklite's checkpoint requests set as pod annotations
// reach the shim through the handler's pod_annotations and shape what CheckpointContainer records.
func TestCRICheckpointPodAnnotations(t *testing.T) {
	d, cri := startCRI(t)
	for _, tc := range []struct {
		name, key, value string
		check            func(checkpoint.Meta) error
	}{
		{"memory only", checkpoint.ContentsKey, "memory", func(m checkpoint.Meta) error {
			if m.Contents != checkpoint.MemoryOnly || m.Frozen != "" {
				return fmt.Errorf("contents %s, frozen layer %q; want memory, none", m.Contents, m.Frozen)
			}
			return nil
		}},
		{"ttl", checkpoint.TTLKey, "1h", func(m checkpoint.Meta) error {
			if ttl := m.Expires.Sub(m.Created); ttl != time.Hour {
				return fmt.Errorf("expires %v after creation, want 1h", ttl)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := criContext(t)
			pod, id := runAnnotatedSleeper(t, cri, "annotated-"+strings.ReplaceAll(tc.name, " ", "-"), map[string]string{tc.key: tc.value})
			archive := filepath.Join(d.Dir, pod.Config.GetMetadata().GetName()+".tar")
			if _, err := cri.Runtime.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: archive}); err != nil {
				t.Fatal(err)
			}
			var meta checkpoint.Meta
			if err := json.Unmarshal(readArchive(t, archive)["checkpoint/"+checkpoint.MetaFile].data, &meta); err != nil {
				t.Fatalf("%s in the archive: %v", checkpoint.MetaFile, err)
			}
			if err := tc.check(meta); err != nil {
				t.Errorf("pod annotated %s=%s: %v", tc.key, tc.value, err)
			}
		})
	}
}
