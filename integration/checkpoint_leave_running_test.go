package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/oci"
)

// TestCheckpointLeavesTaskRunning: a checkpoint that leaves the task running never stops it (issue
// 15): ten checkpoints of an idle busybox container keep its processes (same pids: the cgroup
// stays frozen from before CRIU's dump to after the capture, which the shim checks) and its rootfs mount
// (same mount id, no unmount and remount); each checkpoint's filesystem is its own (files written
// between checkpoints, one deleted, a directory removed and made again), which rollbacks to the
// third and the tenth show. A cklite-snapshotter that is gone during a checkpoint fails that
// checkpoint and leaves the task running.
func TestCheckpointLeavesTaskRunning(t *testing.T) {
	e := newCkEnv(t)
	c := e.newContainer(t, "idle", e.img, oci.WithProcessArgs("sh", "-c", "sleep 1000000 & sleep 1000000 & wait"))
	task, err := startTask(e.ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	rootfs := e.d.RootfsPath(c.ID())
	mnt := rootMountID(t, task.Pid())
	pids := waitPids(t, e, task, 3) // the shell and its two children
	same := func(when string) {
		t.Helper()
		e.expectStatus(t, task, client.Running, when)
		if m := rootMountID(t, task.Pid()); m != mnt {
			t.Fatalf("%s: the init's rootfs is mount %s, it was %s: it was mounted again", when, m, mnt)
		}
		if now := taskPids(t, e, task); !slices.Equal(now, pids) {
			t.Fatalf("%s: the task's processes are %v, they were %v: they were restored or restarted", when, now, pids)
		}
	}
	ids := map[int]string{}
	wants := map[int]map[string]string{}
	for i := 1; i <= 10; i++ {
		changeFiles(t, rootfs, i)
		ids[i], wants[i] = e.timedCheckpoint(t, c.ID(), fmt.Sprint("leave-", i)), treeFiles(t, rootfs)
		same(fmt.Sprintf("after checkpoint %d", i))
		if i == 5 {
			e.snapshotterGone(t, task, func() { same("after a checkpoint without cklite-snapshotter") })
		}
	}
	// The shim's step times of each checkpoint, from the task API's arrival to its answer.
	for _, l := range strings.Split(e.d.LogTail(1000), "\n") {
		if strings.Contains(l, "checkpoint steps") {
			t.Log(l)
		}
	}
	if i := ids[3]; len(wants[3]) == 0 || maps.Equal(wants[3], wants[10]) {
		t.Fatalf("checkpoints 3 (%s) and 10 hold the same files %v: the test changes nothing", i, wants[3])
	}

	for _, i := range []int{3, 10} {
		cklite(t, e.d, "rollback", c.ID(), ids[i])
		if got := treeFiles(t, rootfs); !maps.Equal(got, wants[i]) {
			t.Fatalf("after a rollback to checkpoint %d the rootfs holds %v, want %v", i, got, wants[i])
		}
	}
}

// snapshotterGone checkpoints task while cklite-snapshotter is stopped (the shim finds it
// gone once the task is frozen and dumped), then while it is killed at a random point; after each,
// same checks that the task runs on as it was.
func (e *ckEnv) snapshotterGone(t *testing.T, task client.Task, same func()) {
	id := task.ID()
	t.Helper()
	if err := e.d.StopSnapshotter(); err != nil {
		t.Fatal(err)
	}
	// The Go client: the CLI says only that the snapshotter is down, not where the shim found it.
	err := e.checkpointErr(task, checkpointDir(t, e.d, "leave-gone"), nil)
	if err == nil || !strings.Contains(err.Error(), "capturing") {
		t.Fatalf("a checkpoint without cklite-snapshotter: %v; want it to fail capturing the rootfs", err)
	}
	if err := e.d.StartSnapshotter(); err != nil {
		t.Fatal(err)
	}
	same()
	e.waitSnapshotter(t, id)

	cmd := e.d.Command(e.ctx, "cklite", "--address", e.d.Address, "-n", e.d.Namespace, "checkpoint", "create", id)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Not a wait for anything: a random point of the checkpoint to kill the snapshotter at.
	time.Sleep(time.Duration(rand.IntN(150)) * time.Millisecond)
	if err := e.d.RestartSnapshotter(true); err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint with cklite-snapshotter killed during it: %v", cmd.Wait())
	same()
	e.waitSnapshotter(t, id)
}

// waitSnapshotter waits until containerd reaches cklite-snapshotter again (its proxy reconnects
// with a backoff) and stats snapshot key.
func (e *ckEnv) waitSnapshotter(t *testing.T, key string) {
	t.Helper()
	eventually(t, "containerd to reach cklite-snapshotter again", func() error {
		_, err := e.sn.Stat(e.ctx, key)
		return err
	})
}

// changeFiles moves the rootfs on before checkpoint i: a file per checkpoint, one of them deleted
// at the fifth, a directory made at the third and removed and made again at the seventh.
func changeFiles(t *testing.T, rootfs string, i int) {
	t.Helper()
	dir := filepath.Join(rootfs, "leave")
	var err error
	switch i {
	case 3:
		err = os.MkdirAll(filepath.Join(dir, "d"), 0o755)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "d", "old"), []byte("old"), 0o644)
		}
	case 5:
		err = os.Remove(filepath.Join(dir, "f2"))
	case 7:
		err = os.RemoveAll(filepath.Join(dir, "d"))
		if err == nil {
			err = os.Mkdir(filepath.Join(dir, "d"), 0o755)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "d", "new"), []byte("new"), 0o644)
		}
	}
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, fmt.Sprint("f", i)), []byte(fmt.Sprint(i)), 0o644)
	}
	if err != nil {
		t.Fatalf("changing the rootfs before checkpoint %d: %v", i, err)
	}
}

// treeFiles reads the files below the rootfs's leave directory: path → content.
func treeFiles(t *testing.T, rootfs string) map[string]string {
	t.Helper()
	got := map[string]string{}
	dir := filepath.Join(rootfs, "leave")
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		got[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// taskPids lists task's processes, sorted.
func taskPids(t *testing.T, e *ckEnv, task client.Task) []uint32 {
	t.Helper()
	ps, err := task.Pids(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	pids := make([]uint32, 0, len(ps))
	for _, p := range ps {
		pids = append(pids, p.Pid)
	}
	slices.Sort(pids)
	return pids
}

// waitPids waits until task has n processes and returns them.
func waitPids(t *testing.T, e *ckEnv, task client.Task, n int) []uint32 {
	t.Helper()
	var pids []uint32
	eventually(t, fmt.Sprintf("task %s to have %d processes", task.ID(), n), func() error {
		if pids = taskPids(t, e, task); len(pids) != n {
			return fmt.Errorf("processes %v", pids)
		}
		return nil
	})
	return pids
}

// rootMountID is the mount id of process pid's root, "/" in its mountinfo.
func rootMountID(t *testing.T, pid uint32) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatalf("the init %d is gone: %v", pid, err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && fields[4] == "/" {
			return fields[0]
		}
	}
	t.Fatalf("no / in the mountinfo of %d (%v)", pid, s.Err())
	return ""
}

// TestCheckpointSwitchRule: a leave-running checkpoint of an upper that changed by more than one of
// the switch rule's limits (64 MiB of bytes, 500 entries to write) takes the in-place cycle
// instead of a capture: the task is restored on a fresh, empty upper (a new init and rootfs
// mount), and the next checkpoint captures again, leaving that task as it is. Rollbacks to both
// show their files.
func TestCheckpointSwitchRule(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files int // written before the first checkpoint, each of size bytes
		size  int
	}{
		{"bytes", 1, 70 << 20},
		{"writes", 600, 100},
	} {
		t.Run(tc.name, func(t *testing.T) { testSwitchRule(t, tc.files, tc.size) })
	}
}

func testSwitchRule(t *testing.T, files, size int) {
	e := newCkEnv(t)
	c := e.newContainer(t, "switch", e.img, oci.WithProcessArgs("sleep", "1000000"))
	task, err := startTask(e.ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	rootfs := e.d.RootfsPath(c.ID())
	pid, mnt := task.Pid(), rootMountID(t, task.Pid())
	big := filepath.Join(rootfs, "big")
	if err := os.Mkdir(big, 0o755); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{'x'}, size)
	for i := range files {
		if err := os.WriteFile(filepath.Join(big, fmt.Sprint(i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	first := e.timedCheckpoint(t, c.ID(), "switch-1")
	// What is past the limit was written before the checkpoint: the switch is decided before
	// the dump, which the in-place cycle then makes once.
	if l := switchLine(t, e); !strings.Contains(l, "dumpedTwice=false") {
		t.Fatalf("the switch was decided after a first dump: %s", l)
	}
	task = e.taskOf(t, c.ID())
	if task.Pid() == pid || rootMountID(t, task.Pid()) == mnt {
		t.Fatalf("after a checkpoint of %d files of %d bytes written, init %d on mount %s (was %d on %s): want the in-place cycle", files, size, task.Pid(), rootMountID(t, task.Pid()), pid, mnt)
	}
	pid, mnt = task.Pid(), rootMountID(t, task.Pid())
	if err := os.WriteFile(filepath.Join(rootfs, "small"), []byte("small"), 0o644); err != nil {
		t.Fatal(err)
	}
	second := e.timedCheckpoint(t, c.ID(), "switch-2")
	if task := e.taskOf(t, c.ID()); task.Pid() != pid || rootMountID(t, pid) != mnt {
		t.Fatalf("after a small checkpoint following a switch, init %d (was %d): want it left running", task.Pid(), pid)
	}
	for _, r := range []struct {
		id    string
		small bool
	}{{first, false}, {second, true}} {
		cklite(t, e.d, "rollback", c.ID(), r.id)
		entries, err := os.ReadDir(big)
		if err != nil || len(entries) != files {
			t.Fatalf("after a rollback to %s, %d files in big (%v), want %d", r.id, len(entries), err, files)
		}
		if fi, err := os.Stat(filepath.Join(big, fmt.Sprint(files-1))); err != nil || fi.Size() != int64(size) {
			t.Fatalf("after a rollback to %s, the last file: %v %v", r.id, fi, err)
		}
		if _, err := os.Stat(filepath.Join(rootfs, "small")); (err == nil) != r.small {
			t.Fatalf("after a rollback to %s, small: %v, want it there: %v", r.id, err, r.small)
		}
	}
}

// timedCheckpoint takes a leave-running checkpoint of container id with cklite into a new image
// directory and returns its id.
func (e *ckEnv) timedCheckpoint(t *testing.T, id, dir string) string {
	t.Helper()
	start := time.Now()
	out := cklite(t, e.d, "checkpoint", "create", "--image-path", checkpointDir(t, e.d, dir), id)
	logTiming(t, "cklite checkpoint create, leave running", start)
	m := createdID.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("cklite checkpoint create printed %q, want a checkpoint id", out)
	}
	return m[1]
}

// taskOf is container id's task now, which must be running. It is loaded afresh: a checkpoint
// past the switch rule, a rollback or a fork's restore gives a container a new init.
func (e *ckEnv) taskOf(t *testing.T, id string) client.Task {
	t.Helper()
	c, err := e.d.Client().LoadContainer(e.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(e.ctx, nil)
	if err != nil {
		t.Fatalf("task of %s: %v", id, err)
	}
	e.expectStatus(t, task, client.Running, "now")
	return task
}

// switchLine is the shim's log line of the switch rule's decision.
func switchLine(t *testing.T, e *ckEnv) string {
	t.Helper()
	for _, l := range strings.Split(e.d.LogTail(1000), "\n") {
		if strings.Contains(l, "switching the upper instead of capturing it") {
			return l
		}
	}
	t.Fatal("the shim logged no switch of the upper")
	return ""
}

// TestCheckpointAfterTaskRestart: a task started again on the same rootfs (a new shim, without
// the capture record of the shim before it in memory) captures only what changed since the last
// capture of the task before it, whose record that capture saved beside the upper; a rollback to
// that checkpoint shows the files of both tasks.
func TestCheckpointAfterTaskRestart(t *testing.T) {
	e := newCkEnv(t)
	c := e.newContainer(t, "restart", e.img, oci.WithProcessArgs("sleep", "1000000"))
	if _, err := startTask(e.ctx, c); err != nil {
		t.Fatal(err)
	}
	rootfs := e.d.RootfsPath(c.ID())
	const files = 40
	if err := os.MkdirAll(filepath.Join(rootfs, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range files {
		if err := os.WriteFile(filepath.Join(rootfs, "data", fmt.Sprint("f", i)), []byte(fmt.Sprint("file ", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.timedCheckpoint(t, c.ID(), "restart-1")
	killTask(e.ctx, t, c)
	if _, err := startTask(e.ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "data", "after"), []byte("after the restart"), 0o644); err != nil {
		t.Fatal(err)
	}
	second := e.timedCheckpoint(t, c.ID(), "restart-2")
	line := lastStepsLine(t, e)
	if !strings.Contains(line, "delta=true") || strings.Contains(line, fmt.Sprint("writes=", files)) {
		t.Fatalf("the restarted task's first checkpoint did not capture a delta on the last capture: %s", line)
	}
	cklite(t, e.d, "rollback", c.ID(), second)
	for _, f := range []string{"f0", fmt.Sprint("f", files-1), "after"} {
		if _, err := os.Stat(filepath.Join(rootfs, "data", f)); err != nil {
			t.Fatalf("after a rollback to the restarted task's checkpoint: %v", err)
		}
	}
}

// lastStepsLine is the shim's log line of the last checkpoint's steps.
func lastStepsLine(t *testing.T, e *ckEnv) string {
	t.Helper()
	last := ""
	for _, l := range strings.Split(e.d.LogTail(1000), "\n") {
		if strings.Contains(l, "checkpoint steps") {
			last = l
		}
	}
	if last == "" {
		t.Fatal("the shim logged no checkpoint steps")
	}
	return last
}
