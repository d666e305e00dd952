package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cklite/cklite/integration/harness"
)

// execHolder is an exec'd shell that draws a token only its memory holds, writes it to
// /tmp/exec-token, waits for /tmp/release and then writes the token from its memory to
// /tmp/exec-done: a restored copy of it writes the checkpointed token, a restarted one could not.
const execHolder = `t=$(cat /proc/sys/kernel/random/uuid); echo $t > /tmp/exec-token
while [ ! -e /tmp/release ]; do sleep 0.1; done; echo $t > /tmp/exec-done`

// TestCRIExecs drives execs as the kubelet does (issue 17): ExecSync's exit codes are exact (0,
// 1, 255, 137 for a kill) and its timeout ends the command, not the container; a container
// checkpointed with CheckpointContainer while an ExecSync runs, then restored from the checkpoint
// image into a new pod, has that exec'd process back with its memory (it writes the token it drew
// before the checkpoint once released), while the source's ExecSync returns normally.
func TestCRIExecs(t *testing.T) {
	d, cri := startCRI(t)
	ctx := criContext(t)
	_, id := runCounterPod(t, cri, "execs", harness.HandlerCklite, true, false)

	for _, want := range []int32{0, 1, 255} {
		expectExecSync(t, cri, id, fmt.Sprintf("exit %d", want), 10, want)
	}
	expectExecSync(t, cri, id, "kill -9 $$", 10, 137)
	_, err := cri.Runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sleep", "86400"}, Timeout: 1})
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("ExecSync of sleep with a 1 s timeout: %v, want a timeout error", err)
	}
	eventually(t, "the timed-out exec to end", func() error {
		if out, err := cri.Exec(ctx, id, "ps", "-o", "args"); err != nil || strings.Contains(out, "sleep 86400") {
			return fmt.Errorf("ps: %q %v", out, err)
		}
		return nil
	})
	if st, err := cri.ContainerState(ctx, id); err != nil || st != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("after the timed-out exec: state %v, %v; want RUNNING", st, err)
	}

	rootfs := cri.RootfsPath(id)
	execDone := make(chan error, 1)
	go func() {
		_, err := cri.Exec(ctx, id, "sh", "-c", execHolder)
		execDone <- err
	}()
	token := waitFileLine(t, filepath.Join(rootfs, "tmp", "exec-token"))
	archive := checkpointPod(t, d, cri, id)
	ref := exportAndPush(t, d, cri, archive, "cri-execs")

	release(t, rootfs)
	if err := <-execDone; err != nil {
		t.Fatalf("the ExecSync running through the checkpoint: %v", err)
	}
	if got := waitFileLine(t, filepath.Join(rootfs, "tmp", "exec-done")); got != token {
		t.Fatalf("the source's exec wrote %q, drew %q", got, token)
	}

	restored := restorePod(t, cri, "execs-restored", harness.HandlerCklite, ref, true)
	if _, err := os.Stat(filepath.Join(restored.Rootfs, "tmp", "exec-done")); err == nil {
		t.Fatal("the restored rootfs has /tmp/exec-done: it is not the checkpoint's")
	}
	release(t, restored.Rootfs)
	if got := waitFileLine(t, filepath.Join(restored.Rootfs, "tmp", "exec-done")); got != token {
		t.Fatalf("the restored exec'd process wrote %q, the checkpointed one drew %q", got, token)
	}
}

// expectExecSync runs script with ExecSync (timeout seconds) in container id and expects exit
// code want.
func expectExecSync(t *testing.T, cri *harness.CRI, id, script string, timeout int64, want int32) {
	t.Helper()
	resp, err := cri.Runtime.ExecSync(criContext(t), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", script}, Timeout: timeout})
	if err != nil {
		t.Fatalf("ExecSync %q: %v", script, err)
	}
	if resp.GetExitCode() != want {
		t.Fatalf("ExecSync %q exited %d, want %d", script, resp.GetExitCode(), want)
	}
}

// release lets the execHolder in the container of rootfs finish.
func release(t *testing.T, rootfs string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(rootfs, "tmp", "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitFileLine waits for file to hold a line and returns it.
func waitFileLine(t *testing.T, file string) string {
	t.Helper()
	var line string
	eventually(t, file, func() error {
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		var ok bool
		if line, _, ok = strings.Cut(string(data), "\n"); !ok {
			return fmt.Errorf("%s holds %q, no whole line yet", file, data)
		}
		return nil
	})
	return line
}
