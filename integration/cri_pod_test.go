package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cklite/cklite/integration/harness"
)

// startCRI starts a daemon with cklite-snapshotter (the cklite handler's snapshotter) and returns a
// CRI client with the busybox image imported for CRI.
func startCRI(t *testing.T) (*harness.Daemon, *harness.CRI) {
	t.Helper()
	d := startDaemon(t, harness.Config{CkliteSnapshotter: true})
	return d, criOf(t, d)
}

// criOf connects to d's CRI plugin with the busybox image imported.
func criOf(t *testing.T, d *harness.Daemon) *harness.CRI {
	t.Helper()
	ctx := criContext(t)
	cri, err := d.CRI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cri.Close() })
	if err := cri.ImportImage(ctx, busybox); err != nil {
		t.Fatal(err)
	}
	return cri
}

// TestCRIPodLifecycle runs a pod through CRI as the kubelet does, on each runtime handler: run the
// sandbox, create and start a container, exec in it, read its stats, stop it, remove the pod. The
// pod's containers must run on the handler's shim and snapshotter; a pod on the CNI bridge must
// have its address inside the container.
func TestCRIPodLifecycle(t *testing.T) {
	d, cri := startCRI(t)
	useBridge(t, cri)
	for _, tc := range []struct {
		name, handler, runtime, snapshotter string
		hostNetwork                         bool
	}{
		{"cklite", harness.HandlerCklite, harness.CkliteRuntime, "cklite", true},
		{"cklite-bridge", harness.HandlerCklite, harness.CkliteRuntime, "cklite", false},
		{"runc", harness.HandlerRunc, "io.containerd.runc.v2", "overlayfs", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := criContext(t)
			pod, err := cri.RunPod(ctx, "life-"+tc.name, tc.handler, tc.hostNetwork)
			if err != nil {
				t.Fatal(err)
			}
			id, err := cri.StartContainer(ctx, pod, pod.Container("app", busybox.Name, "sh", "-c", "echo started; exec sleep 3600"))
			if err != nil {
				t.Fatal(err)
			}
			for _, cid := range []string{pod.ID, id} {
				checkRuntime(t, d, cri, cid, tc.runtime, tc.snapshotter)
			}
			if !tc.hostNetwork {
				checkPodIP(t, cri, pod, id)
			}

			out, err := cri.Exec(ctx, id, "sh", "-c", "echo hello > /tmp/f && cat /tmp/f")
			if err != nil || out != "hello\n" {
				t.Fatalf("exec: %q, %v", out, err)
			}
			if _, err := cri.Exec(ctx, id, "false"); err == nil || !strings.Contains(err.Error(), "exit code 1") {
				t.Errorf("exec of false: %v, want exit code 1", err)
			}

			stats, err := cri.Runtime.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: id})
			if err != nil {
				t.Fatal(err)
			}
			if mem := stats.GetStats().GetMemory().GetWorkingSetBytes().GetValue(); mem == 0 {
				t.Errorf("container stats: working set 0: %v", stats.GetStats())
			}

			if _, err := cri.Runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 2}); err != nil {
				t.Fatal(err)
			}
			st, err := cri.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
			if err != nil {
				t.Fatal(err)
			}
			// sleep ignores SIGTERM as PID 1, so StopContainer's timeout ends it with SIGKILL.
			if got := st.GetStatus(); got.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED || got.GetExitCode() != 137 {
				t.Errorf("after StopContainer: state %v, exit code %d; want EXITED, 137", got.GetState(), got.GetExitCode())
			}

			if err := cri.RemovePod(ctx, pod); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Client().LoadContainer(cri.Context(ctx), id); err == nil {
				t.Errorf("container %s still in containerd after RemovePodSandbox", id)
			}
		})
	}
}

// useBridge gives the test's pods that are not on the host's network a bridge of their own, on a
// subnet unlikely to be another test's.
func useBridge(t *testing.T, cri *harness.CRI) {
	t.Helper()
	remove, err := cri.UseBridge(criContext(t), fmt.Sprintf("ckcri%04x", rand.IntN(1<<16)), fmt.Sprintf("10.214.%d.0/24", rand.IntN(256)))
	if remove != nil {
		t.Cleanup(func() {
			if err := remove(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// checkPodIP fails the test unless container id of the pod has the pod's IP address.
func checkPodIP(t *testing.T, cri *harness.CRI, pod *harness.Pod, id string) {
	t.Helper()
	ctx := criContext(t)
	st, err := cri.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod.ID})
	if err != nil {
		t.Fatal(err)
	}
	ip := st.GetStatus().GetNetwork().GetIp()
	out, err := cri.Exec(ctx, id, "ip", "-o", "-4", "addr", "show", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if ip == "" || !strings.Contains(out, " "+ip+"/") {
		t.Errorf("pod IP %q, container's eth0: %s", ip, out)
	}
}

// checkRuntime fails the test unless containerd runs container id on runtime and snapshotter.
func checkRuntime(t *testing.T, d *harness.Daemon, cri *harness.CRI, id, runtime, snapshotter string) {
	t.Helper()
	ctx := cri.Context(criContext(t))
	c, err := d.Client().LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Runtime.Name != runtime || info.Snapshotter != snapshotter {
		t.Errorf("container %s runs on %s / %s, want %s / %s", id, info.Runtime.Name, info.Snapshotter, runtime, snapshotter)
	}
}

// criContext bounds a test's CRI calls, like ckEnv's context: a hanging shim fails the test
// rather than the run, whose timeout would skip every cleanup.
func criContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), ckTimeout)
	t.Cleanup(cancel)
	return ctx
}
