package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/integration/shimproc"
	"github.com/cklite/cklite/integration/workload"
)

// TestShimKilledMidCheckpoint kills the shim with SIGKILL while CRIU works: during the dump of a
// leave-running checkpoint (CRIU holds the task's processes, the cgroup is frozen) and during the
// restore of an in-place rollback (a leave-running checkpoint restores nothing since issue 15).
// Each time no CRIU process may outlive the shim, containerd's cleanup (`shim delete`) must leave
// nothing behind (no libcontainer state, no CRIU cgroup mounts in the bundle, no cgroup), and a
// new task of the same container must start and run, not frozen (issue 16 items 2, 3 and 7).
func TestShimKilledMidCheckpoint(t *testing.T) {
	e := newCkEnv(t)
	for round, log := range []string{"dump.log", "restore.log"} {
		t.Run("kill while CRIU writes "+log, func(t *testing.T) {
			id := fmt.Sprintf("killed-%d", round)
			c, task, cnt := e.startCounter(t, id)
			before := cnt.advance(t, 1)
			shims := shimproc.Find(e.d.Address, id)
			if len(shims) != 1 {
				t.Fatalf("shims of %s: %v, want one", id, shims)
			}
			shim := shims[0]
			done := make(chan error, 1)
			if log == "dump.log" {
				go func() { done <- e.checkpointErr(task, checkpointDir(t, e.d, id), nil) }()
			} else {
				m := e.checkpointTo(t, task, checkpointDir(t, e.d, id), nil)
				go func() {
					_, err := e.d.Cklite(e.ctx, "rollback", id, m.ID)
					done <- err
				}()
			}
			criu, cwd := waitForCRIU(t, shim, log, task.Pid(), done)
			if err := unix.Kill(shim, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
			t.Logf("killed shim %d while CRIU %d ran in %s", shim, criu, cwd)
			if err := <-done; err == nil {
				t.Fatal("the checkpoint or rollback succeeded although its shim was killed")
			}
			eventually(t, fmt.Sprintf("CRIU %d to end with its shim", criu), func() error {
				if criuAlive(criu) {
					return fmt.Errorf("CRIU %d (working in %s) outlived its shim %d", criu, cwd, shim)
				}
				return nil
			})
			e.deleteDeadTask(t, c)
			expectNoneLeft(t, e, id, cwd)
			restarted := e.startAgain(t, c)
			cnt.waitFor(t, "the new task's counter", func(x workload.Count) bool { return x.Token != before.Token })
			x := cnt.advance(t, 3)
			t.Logf("the new task %d counts: %+v", restarted.Pid(), x)
		})
	}
}

// waitForCRIU waits until a CRIU process of shim has its log named log open (dump.log or
// restore.log: libcontainer's, in the CRIU work directory), and, for a dump, holds the task's init
// pid under ptrace: CRIU is then in the middle of its work. It returns CRIU's pid and working
// directory, and fails the test if the checkpoint ends first.
func waitForCRIU(t *testing.T, shim int, log string, pid uint32, done <-chan error) (int, string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		for _, criu := range childrenOf(shim) {
			if !criuAlive(criu) || !hasFileNamed(criu, log) || (log == "dump.log" && tracerOf(pid) != criu) {
				continue
			}
			cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", criu))
			return criu, cwd
		}
		select {
		case err := <-done:
			t.Fatalf("the checkpoint ended (%v) before CRIU was seen working on %s", err, log)
		default:
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("shim %d ran no CRIU writing %s within 2 minutes", shim, log)
	return 0, ""
}

// hasFileNamed reports whether pid has a file whose name is name open.
func hasFileNamed(pid int, name string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, _ := os.ReadDir(dir)
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && filepath.Base(target) == name {
			return true
		}
	}
	return false
}

// tracerOf is the pid ptrace-attached to pid, or 0.
func tracerOf(pid uint32) int {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "TracerPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// childrenOf lists pid's child processes.
func childrenOf(pid int) []int {
	var kids []int
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(f); err == nil {
				kids = append(kids, n)
			}
		}
	}
	return kids
}

// criuAlive reports whether pid is still a CRIU process that has not exited.
func criuAlive(pid int) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return err == nil && filepath.Base(exe) == "criu"
}

// deleteDeadTask waits for containerd to see c's task gone with its shim and deletes it.
func (e *ckEnv) deleteDeadTask(t *testing.T, c client.Container) {
	t.Helper()
	eventually(t, "containerd to delete the task of the killed shim", func() error {
		task, err := c.Task(e.ctx, nil)
		if errdefs.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := task.Delete(e.ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		return errors.New("deleted, checking again")
	})
}

// expectNoneLeft waits for nothing of container id's killed shim to be left (containerd's
// cleanup runs `shim delete` in the background): no mount below its bundle (CRIU's cgroup yard,
// the rootfs), no libcontainer state, no shim.
func expectNoneLeft(t *testing.T, e *ckEnv, id, bundle string) {
	t.Helper()
	eventually(t, "the killed shim's cleanup", func() error {
		var left []string
		mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(bundle))
		if err != nil {
			return err
		}
		for _, m := range mounts {
			left = append(left, fmt.Sprintf("mount %s (%s)", m.Mountpoint, m.FSType))
		}
		state := filepath.Join("/run/containerd/runc", e.d.Namespace, id)
		if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
			left = append(left, "libcontainer state "+state)
		}
		more, err := leftovers(e.d, id, "")
		if err != nil {
			return err
		}
		if left = append(left, more...); len(left) > 0 {
			return fmt.Errorf("left: %s", strings.Join(left, ", "))
		}
		return nil
	})
}

// startAgain starts a new task of c once containerd has dropped the killed one (it does so after
// its `shim delete` has returned).
func (e *ckEnv) startAgain(t *testing.T, c client.Container) client.Task {
	t.Helper()
	var task client.Task
	eventually(t, "containerd to drop the killed task", func() error {
		var err error
		task, err = c.NewTask(e.ctx, cio.NullIO)
		if errdefs.IsAlreadyExists(err) {
			return err
		}
		if err != nil {
			t.Fatalf("creating a task of %s again after its shim was killed mid-checkpoint: %v", c.ID(), err)
		}
		return nil
	})
	if err := task.Start(e.ctx); err != nil {
		t.Fatalf("starting %s again after its shim was killed mid-checkpoint: %v", c.ID(), err)
	}
	return task
}

// TestCRIUKilledMidDump kills CRIU (not the shim) while it dumps a leave-running checkpoint: the
// checkpoint fails and the task must run on, thawed, with the same processes (issue 16 item 7: a
// task was found frozen a minute after CRIU died mid-dump), and nothing be recorded. The first
// dump of a shim goes through libcontainer; a later one through the dump driver, to a CRIU
// started ahead (runtime/dumpdriver.go).
func TestCRIUKilledMidDump(t *testing.T) {
	for _, tc := range []struct {
		name  string
		later bool
	}{{"first dump, libcontainer's", false}, {"later dump, the driver's", true}} {
		t.Run(tc.name, func(t *testing.T) { criuKilledMidDump(t, tc.later) })
	}
}

func criuKilledMidDump(t *testing.T, later bool) {
	e := newCkEnv(t)
	_, task, cnt := e.startCounter(t, "criu-killed")
	shims := shimproc.Find(e.d.Address, task.ID())
	if len(shims) != 1 {
		t.Fatalf("shims of %s: %v, want one", task.ID(), shims)
	}
	if later {
		e.checkpointTo(t, task, checkpointDir(t, e.d, "criu-killed-before"), nil)
		oneReadyCRIU(t, shims[0], task.Pid(), nil)
	}
	at := cnt.advance(t, 1)
	before := e.records(t)
	done := make(chan error, 1)
	go func() { done <- e.checkpointErr(task, checkpointDir(t, e.d, "criu-killed"), nil) }()
	criu, _ := waitForCRIU(t, shims[0], "dump.log", task.Pid(), done)
	if err := unix.Kill(criu, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("the checkpoint succeeded although its CRIU was killed")
	} else {
		t.Logf("the checkpoint failed as it should: %v", err)
	}
	e.expectStatus(t, task, client.Running, fmt.Sprintf("after CRIU was killed mid-dump (freezer %s)", freezerState(task.Pid())))
	expectContinues(t, cnt, at)
	if after := e.records(t); len(after) != len(before) {
		t.Fatalf("%d checkpoints listed after the failed one, %d before: %v", len(after), len(before), recordIDs(after))
	}
}

// freezerState reads the cgroup v1 freezer state of pid's cgroup, for failure messages.
func freezerState(pid uint32) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return err.Error()
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && f[1] == "freezer" {
			st, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", f[2], "freezer.state"))
			if err != nil {
				return err.Error()
			}
			return strings.TrimSpace(string(st))
		}
	}
	return "no freezer cgroup"
}
