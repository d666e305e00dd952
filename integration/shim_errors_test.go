package integration

// The TestShim tests in this file feed the shim bad input through the containerd Go client. Each
// must get an error that names the cause (never a panic), and leave nothing behind: no shim, no
// mount, no cgroup. Where the runc shim's answer is poor (an error of no class), the cklite
// subtest asks for the answer we want, and the comment says so.

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	taskv3 "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/integration/harness"
)

// TestShimInvalidSpec starts tasks whose spec the runtime must refuse.
func TestShimInvalidSpec(t *testing.T) {
	cases := []struct {
		name  string
		spec  oci.SpecOpts
		cause string // the error names it
	}{
		{"no process args", withSpec(func(s *specs.Spec) { s.Process.Args = nil }), "args"},
		{"missing binary", oci.WithProcessArgs("/no/such/binary"), "/no/such/binary"},
		// runc-v2 says "Cwd must be an absolute path", without the path.
		{"relative cwd", withSpec(func(s *specs.Spec) { s.Process.Cwd = "relative/dir" }), "absolute"},
		{"unknown namespace", withSpec(func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: "bogus"})
		}), "bogus"},
	}
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				ctx := clientContext(t, d)
				c := newBusyboxContainer(t, ctx, d, rt, strings.ReplaceAll(tc.name, " ", "-"), tc.spec)
				_, err := startTask(ctx, c)
				expectError(t, err, tc.cause)
				removeExpectingNoLeftovers(t, ctx, d, c)
			})
		}
	})
}

// TestShimMissingRootfs starts tasks whose root filesystem is not there.
func TestShimMissingRootfs(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		t.Run("snapshot removed", func(t *testing.T) {
			ctx := clientContext(t, d)
			c := newBusyboxContainer(t, ctx, d, rt, "no-snapshot")
			info, err := c.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Client().SnapshotService(info.Snapshotter).Remove(ctx, info.SnapshotKey); err != nil {
				t.Fatal(err)
			}
			_, err = startTask(ctx, c)
			expectError(t, err, info.SnapshotKey)
			if !errdefs.IsNotFound(err) {
				t.Errorf("error is not NotFound: %v", err)
			}
			removeExpectingNoLeftovers(t, ctx, d, c)
		})
		t.Run("root path absent", func(t *testing.T) {
			ctx := clientContext(t, d)
			root := filepath.Join(d.Dir, "no-such-rootfs")
			spec, err := oci.GenerateSpec(ctx, d.Client(), &containers.Container{ID: "no-rootfs"},
				oci.WithRootFSPath(root), oci.WithProcessArgs("/bin/sh"))
			if err != nil {
				t.Fatal(err)
			}
			c, err := d.Client().NewContainer(ctx, "no-rootfs", client.WithRuntime(rt, nil), client.WithSpec(spec))
			if err != nil {
				t.Fatal(err)
			}
			_, err = startTask(ctx, c)
			expectError(t, err, root)
			removeExpectingNoLeftovers(t, ctx, d, c)
		})
	})
}

// TestShimExecInStoppedTask execs in a task whose process has exited.
func TestShimExecInStoppedTask(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		ctx := clientContext(t, d)
		c := newBusyboxContainer(t, ctx, d, rt, "stopped", oci.WithProcessArgs("true"))
		task, err := startTask(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		waitForExit(t, ctx, task)
		spec, err := c.Spec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pspec := *spec.Process
		pspec.Args = []string{"echo", "too late"}
		// The refusal may come from Exec or from starting the exec.
		p, err := task.Exec(ctx, "late", &pspec, cio.NullIO)
		if err == nil {
			err = p.Start(ctx)
		}
		expectError(t, err, "stopped")
		// runc-v2 answers with an error of no class ("cannot exec in a stopped state"); cklite
		// should say FailedPrecondition, the class of "not in a state to do this".
		if rt == harness.CkliteRuntime && !errdefs.IsFailedPrecondition(err) {
			t.Errorf("error is not FailedPrecondition: %v", err)
		}
		removeExpectingNoLeftovers(t, ctx, d, c)
	})
}

// TestShimDoubleStart starts a running task again: refused, and the task keeps running.
func TestShimDoubleStart(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		ctx := clientContext(t, d)
		c := newBusyboxContainer(t, ctx, d, rt, "twice", oci.WithProcessArgs("sleep", "3600"))
		task, err := startTask(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		err = task.Start(ctx)
		expectError(t, err, "running")
		// runc-v2: "cannot start a running process", of no class; cklite should say
		// FailedPrecondition.
		if rt == harness.CkliteRuntime && !errdefs.IsFailedPrecondition(err) {
			t.Errorf("error is not FailedPrecondition: %v", err)
		}
		expectRunning(t, ctx, task)
		removeExpectingNoLeftovers(t, ctx, d, c)
	})
}

// TestShimUnknownExecID sends the calls that address an exec process by id with an id no exec
// has, both through containerd (which asks the shim for the process's State first) and straight
// to the shim's ttrpc socket (reaching each of the shim's handlers): each is NotFound and names
// the id, and the task is unharmed.
func TestShimUnknownExecID(t *testing.T) {
	const execID = "no-such-exec"
	calls := []struct {
		name string
		// viaContainerd is nil where containerd's task API has no such call.
		viaContainerd func(ctx context.Context, ts tasks.TasksClient, id string) error
		toShim        func(ctx context.Context, shim taskv3.TTRPCTaskService, id string) error
		// runcNoClass: runc-v2's handler returns its error unconverted, so it arrives as Unknown
		// (with the right message); cklite should keep it NotFound.
		runcNoClass bool
	}{
		{"Kill", func(ctx context.Context, ts tasks.TasksClient, id string) error {
			_, err := ts.Kill(ctx, &tasks.KillRequest{ContainerID: id, ExecID: execID, Signal: uint32(syscall.SIGKILL)})
			return err
		}, func(ctx context.Context, shim taskv3.TTRPCTaskService, id string) error {
			_, err := shim.Kill(ctx, &taskv3.KillRequest{ID: id, ExecID: execID, Signal: uint32(syscall.SIGKILL)})
			return err
		}, false},
		{"ResizePty", func(ctx context.Context, ts tasks.TasksClient, id string) error {
			_, err := ts.ResizePty(ctx, &tasks.ResizePtyRequest{ContainerID: id, ExecID: execID, Width: 80, Height: 24})
			return err
		}, func(ctx context.Context, shim taskv3.TTRPCTaskService, id string) error {
			_, err := shim.ResizePty(ctx, &taskv3.ResizePtyRequest{ID: id, ExecID: execID, Width: 80, Height: 24})
			return err
		}, false},
		{"CloseIO", func(ctx context.Context, ts tasks.TasksClient, id string) error {
			_, err := ts.CloseIO(ctx, &tasks.CloseIORequest{ContainerID: id, ExecID: execID, Stdin: true})
			return err
		}, func(ctx context.Context, shim taskv3.TTRPCTaskService, id string) error {
			_, err := shim.CloseIO(ctx, &taskv3.CloseIORequest{ID: id, ExecID: execID, Stdin: true})
			return err
		}, true},
		{"Delete", func(ctx context.Context, ts tasks.TasksClient, id string) error {
			_, err := ts.DeleteProcess(ctx, &tasks.DeleteProcessRequest{ContainerID: id, ExecID: execID})
			return err
		}, func(ctx context.Context, shim taskv3.TTRPCTaskService, id string) error {
			_, err := shim.Delete(ctx, &taskv3.DeleteRequest{ID: id, ExecID: execID})
			return err
		}, false},
		{"State", func(ctx context.Context, ts tasks.TasksClient, id string) error {
			_, err := ts.Get(ctx, &tasks.GetRequest{ContainerID: id, ExecID: execID})
			return err
		}, func(ctx context.Context, shim taskv3.TTRPCTaskService, id string) error {
			_, err := shim.State(ctx, &taskv3.StateRequest{ID: id, ExecID: execID})
			return err
		}, false},
		{"Start", nil, func(ctx context.Context, shim taskv3.TTRPCTaskService, id string) error {
			_, err := shim.Start(ctx, &taskv3.StartRequest{ID: id, ExecID: execID})
			return err
		}, false},
		{"Wait", nil, func(ctx context.Context, shim taskv3.TTRPCTaskService, id string) error {
			_, err := shim.Wait(ctx, &taskv3.WaitRequest{ID: id, ExecID: execID})
			return err
		}, false},
	}
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		ctx := clientContext(t, d)
		c := newBusyboxContainer(t, ctx, d, rt, "execs", oci.WithProcessArgs("sleep", "3600"))
		task, err := startTask(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		shim := dialShim(t, d, c.ID())
		check := func(t *testing.T, err error, notFound bool) {
			t.Helper()
			err = errgrpc.ToNative(err)
			expectError(t, err, execID)
			if notFound && !errdefs.IsNotFound(err) {
				t.Errorf("error is not NotFound: %v", err)
			}
			expectRunning(t, ctx, task)
		}
		for _, tc := range calls {
			if tc.viaContainerd != nil {
				t.Run(tc.name+" via containerd", func(t *testing.T) {
					check(t, tc.viaContainerd(ctx, d.Client().TaskService(), c.ID()), true)
				})
			}
			t.Run(tc.name+" to the shim", func(t *testing.T) {
				check(t, tc.toShim(ctx, shim, c.ID()), rt != runcRuntime || !tc.runcNoClass)
			})
		}
		removeExpectingNoLeftovers(t, ctx, d, c)
	})
}

// dialShim connects to the ttrpc task API of container id's shim, at the address containerd
// recorded in the bundle's bootstrap.json.
func dialShim(t *testing.T, d *harness.Daemon, id string) taskv3.TTRPCTaskService {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(filepath.Dir(d.RootfsPath(id)), "bootstrap.json"))
	if err != nil {
		t.Fatal(err)
	}
	var params struct {
		Address  string `json:"address"`
		Protocol string `json:"protocol"`
	}
	if err := json.Unmarshal(data, &params); err != nil {
		t.Fatalf("bootstrap.json: %v", err)
	}
	if params.Protocol != "ttrpc" {
		t.Fatalf("the shim speaks %q, not ttrpc", params.Protocol)
	}
	conn, err := net.Dial("unix", strings.TrimPrefix(params.Address, "unix://"))
	if err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn)
	t.Cleanup(func() { client.Close() })
	return taskv3.NewTTRPCTaskClient(client)
}

// TestShimCgroupConflict starts two containers with the same cgroupsPath: the second must fail
// and name the cgroup, and the first keeps running.
func TestShimCgroupConflict(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		ctx := clientContext(t, d)
		// Below the daemon's namespace, where teardown would find it if the test did not.
		cgroup := "/" + d.Namespace + "/shared"
		opts := []oci.SpecOpts{oci.WithProcessArgs("sleep", "3600"), oci.WithCgroup(cgroup)}
		first := newBusyboxContainer(t, ctx, d, rt, "first", opts...)
		firstTask, err := startTask(ctx, first)
		if err != nil {
			t.Fatal(err)
		}
		second := newBusyboxContainer(t, ctx, d, rt, "second", opts...)
		_, err = startTask(ctx, second)
		// runc-v2 says "container's cgroup is not empty: 1 process(es) found", which does not say
		// which cgroup; cklite should name it.
		cause := "cgroup"
		if rt == harness.CkliteRuntime {
			cause = cgroup
		}
		expectError(t, err, cause)
		expectRunning(t, ctx, firstTask)
		// The cgroup stays the first container's: the second's cleanup must not take it away.
		remove(t, ctx, second)
		expectNoLeftovers(t, d, second.ID(), "")
		left, err := leftovers(d, first.ID(), cgroup)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(left, func(s string) bool { return strings.HasPrefix(s, "cgroup ") }) {
			t.Fatalf("the first container's cgroup %s is gone after the second failed", cgroup)
		}
		removeExpectingNoLeftovers(t, ctx, d, first)
	})
}

// withSpec adapts a plain spec edit to oci.SpecOpts.
func withSpec(edit func(*specs.Spec)) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		edit(s)
		return nil
	}
}

// clientContext is a context in the daemon's namespace for the test's client calls, bounded so a
// hanging shim fails the test rather than the run.
func clientContext(t *testing.T, d *harness.Daemon) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(d.Context(context.Background()), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newBusyboxContainer creates container id of the busybox image (unpacked on first use) with
// runtime rt; opts apply after the image's config.
func newBusyboxContainer(t *testing.T, ctx context.Context, d *harness.Daemon, rt, id string, opts ...oci.SpecOpts) client.Container {
	t.Helper()
	img, err := d.Client().GetImage(ctx, busybox.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := img.Unpack(ctx, ""); err != nil {
		t.Fatal(err)
	}
	c, err := d.Client().NewContainer(ctx, id,
		client.WithRuntime(rt, nil),
		client.WithNewSnapshot(id, img),
		client.WithNewSpec(append([]oci.SpecOpts{oci.WithImageConfig(img)}, opts...)...))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startTask creates and starts c's task, returning the task if it was created and the first error.
func startTask(ctx context.Context, c client.Container) (client.Task, error) {
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		return nil, err
	}
	return task, task.Start(ctx)
}

// expectError fails t unless err is an error that names cause and is no panic of a shim (which
// containerd reports as the shim's connection closing).
func expectError(t *testing.T, err error, cause string) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("no error; want one naming %q", cause)
	case strings.Contains(err.Error(), "panic") || strings.Contains(err.Error(), "ttrpc: closed"):
		t.Fatalf("the shim crashed: %v", err)
	case !strings.Contains(err.Error(), cause):
		t.Errorf("error does not name %q: %v", cause, err)
	default:
		t.Logf("error as expected: %v", err)
	}
}

func waitForExit(t *testing.T, ctx context.Context, task client.Task) {
	t.Helper()
	exitC, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-exitC:
	case <-ctx.Done():
		t.Fatalf("task %s did not exit: %v", task.ID(), ctx.Err())
	}
}

func expectRunning(t *testing.T, ctx context.Context, task client.Task) {
	t.Helper()
	status, err := task.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if status.Status != client.Running {
		t.Fatalf("task %s is %s, want running", task.ID(), status.Status)
	}
}

// removeExpectingNoLeftovers deletes c with its task, if any, and its snapshot, then checks nothing
// of it is left and no shim panicked.
func removeExpectingNoLeftovers(t *testing.T, ctx context.Context, d *harness.Daemon, c client.Container) {
	t.Helper()
	cgroupsPath := remove(t, ctx, c)
	expectNoLeftovers(t, d, c.ID(), cgroupsPath)
	expectNoPanic(t, d)
}

// remove deletes c with its task, if any, and its snapshot, and returns its cgroupsPath.
func remove(t *testing.T, ctx context.Context, c client.Container) string {
	t.Helper()
	spec, err := c.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if task, err := c.Task(ctx, nil); err == nil {
		exitC, err := task.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if status, _ := task.Status(ctx); status.Status == client.Running {
			if err := task.Kill(ctx, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-exitC
		}
		if _, err := task.Delete(ctx); err != nil {
			t.Fatalf("deleting the task: %v", err)
		}
	} else if !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		t.Fatalf("deleting the container: %v", err)
	}
	return spec.Linux.CgroupsPath
}

// expectNoPanic checks containerd's log, which holds what shims write to stderr, shows no panic.
func expectNoPanic(t *testing.T, d *harness.Daemon) {
	t.Helper()
	if log, err := os.ReadFile(filepath.Join(d.Dir, "containerd.log")); err == nil && strings.Contains(string(log), "panic:") {
		t.Fatalf("a panic in containerd's log:\n%s", d.LogTail(60))
	}
}
