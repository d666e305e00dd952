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

// TestShimKilledMidCheckpoint kills the shim with SIGKILL while CRIU works on a leave-running
// checkpoint: once during the dump (CRIU holds the task's processes, the cgroup is frozen) and
// once during the restore in place. Each time no CRIU process may outlive the shim, containerd's
// cleanup (`shim delete`) must leave nothing behind (no libcontainer state, no CRIU cgroup
// mounts in the bundle, no cgroup), and a new task of the same container must start and run,
// not frozen (issue 16 items 2, 3 and 7).
func TestShimKilledMidCheckpoint(t *testing.T) {
	e := newCkEnv(t)
	for round, nthCRIU := range []int{1, 2} { // the dump's CRIU, then the restore's
		t.Run(fmt.Sprintf("kill at CRIU run %d", nthCRIU), func(t *testing.T) {
			id := fmt.Sprintf("killed-%d", round)
			c, task, cnt := e.startCounter(t, id)
			before := cnt.advance(t, 1)
			shims := shimproc.Find(e.d.Address, id)
			if len(shims) != 1 {
				t.Fatalf("shims of %s: %v, want one", id, shims)
			}
			shim := shims[0]
			done := make(chan error, 1)
			go func() { done <- e.checkpointErr(task, checkpointDir(t, e.d, id), nil) }()
			criu, cwd := waitForCRIU(t, shim, nthCRIU, done)
			if err := unix.Kill(shim, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
			t.Logf("killed shim %d while CRIU %d ran in %s", shim, criu, cwd)
			if err := <-done; err == nil {
				t.Fatal("the checkpoint succeeded although its shim was killed")
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

// waitForCRIU waits until shim has started its nth CRIU process and returns its pid and working
// directory; it fails the test if the checkpoint ends first.
func waitForCRIU(t *testing.T, shim, nth int, done <-chan error) (int, string) {
	t.Helper()
	seen := map[int]bool{}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		for _, pid := range childrenOf(shim) {
			exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
			if filepath.Base(exe) != "criu" || seen[pid] {
				continue
			}
			seen[pid] = true
			if len(seen) == nth {
				cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
				return pid, cwd
			}
		}
		select {
		case err := <-done:
			t.Fatalf("the checkpoint ended (%v) before CRIU run %d was seen", err, nth)
		default:
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no CRIU run %d of shim %d within 2 minutes", nth, shim)
	return 0, ""
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
