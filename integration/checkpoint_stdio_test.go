package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// redirectingTicks prints a line on stdout every round and spends nearly all its time in a compound
// command redirected to a file: busybox sh then has its fd 1 on that file and the stdout pipe
// parked on fd 10, which is the moment a checkpoint or rollback usually finds it in.
const redirectingTicks = `i=0; while :; do i=$((i+1)); echo "tick $i"; { sleep 0.05; } >/tmp/redirected; done`

// TestCheckpointStdioIdentity checkpoints (leaving it running) and rolls back in place a task
// whose init keeps its stdout pipe away from fd 1 most of the time, 20 times: every checkpoint
// must succeed and the output must keep reaching the client through the same pipe. A restore in
// place that took the init's fds 0-2 for its stdio handed CRIU the shim's /dev/null in place of
// the pipe: the output stopped and every later dump failed with "Can't lookup mount=... for fd=1
// path=/dev/null" (issue 16 item 6).
func TestCheckpointStdioIdentity(t *testing.T) {
	const cycles = 20
	e := newCkEnv(t)
	out := &lockedBuffer{}
	c := e.newContainer(t, "ticks", e.img, oci.WithProcessArgs("sh", "-c", redirectingTicks))
	task, err := c.NewTask(e.ctx, cio.NewCreator(cio.WithStreams(nil, out, out), cio.WithFIFODir(e.d.FIFODir())))
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	ticks := waitTicks(t, out, 0)
	for i := range cycles {
		dir := checkpointDir(t, e.d, fmt.Sprintf("ticks-%d", i))
		if err := e.checkpointErr(task, dir, nil); err != nil {
			t.Fatalf("checkpoint %d of %d: %v%s", i+1, cycles, err, criuErrors(err))
		}
		ticks = waitTicks(t, out, ticks)
		if i%5 == 4 {
			e.rollbackInPlace(t, task, dir)
			ticks = waitTicks(t, out, ticks)
		}
		expectNoHostNull(t, e, task)
	}
}

// waitTicks waits for the output to hold more tick lines than after and returns how many it has.
func waitTicks(t *testing.T, out *lockedBuffer, after int) int {
	t.Helper()
	var n int
	eventually(t, fmt.Sprintf("more than %d lines of output", after), func() error {
		if n = strings.Count(out.String(), "tick "); n <= after {
			return fmt.Errorf("%d lines of output: the task's stdout no longer reaches the client", n)
		}
		return nil
	})
	return n
}

// expectNoHostNull fails if a process of task holds, on any fd, a /dev/null other than the
// container's own (the one its init reopened from the container's /dev).
func expectNoHostNull(t *testing.T, e *ckEnv, task client.Task) {
	t.Helper()
	procs, err := task.Pids(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		dir := fmt.Sprintf("/proc/%d/fd", p.Pid)
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // gone meanwhile
		}
		for _, fd := range entries {
			target, _ := os.Readlink(filepath.Join(dir, fd.Name()))
			if target != "/dev/null" {
				continue
			}
			if mnt, _ := fdMountID(p.Pid, fd.Name()); !mountInProcNS(p.Pid, mnt) {
				t.Fatalf("process %d's fd %s is /dev/null of mount %s, outside the container's mounts: its stdio was lost", p.Pid, fd.Name(), mnt)
			}
		}
	}
}

// fdMountID is the mount id /proc/PID/fdinfo/FD names.
func fdMountID(pid uint32, fd string) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "mnt_id:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no mnt_id in fdinfo")
}

// mountInProcNS reports whether mount id mnt is in pid's mount namespace.
func mountInProcNS(pid uint32, mnt string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return true // gone meanwhile: nothing to say
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == mnt {
			return true
		}
	}
	return false
}

// rollbackInPlace rolls task back to the checkpoint in dir in place, as `cklite rollback` asks
// the shim to (an annotation of a task Update).
func (e *ckEnv) rollbackInPlace(t *testing.T, task client.Task, dir string) {
	t.Helper()
	start := time.Now()
	if err := task.Update(e.ctx, client.WithAnnotations(map[string]string{checkpoint.RollbackKey: dir})); err != nil {
		t.Fatalf("rolling %s back in place to %s: %v%s", task.ID(), dir, err, criuErrors(err))
	}
	logTiming(t, "rollback in place", start)
}
