package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/cgroups"
	_ "github.com/opencontainers/cgroups/devices" // registers the device-rules manager, as runc does
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Container is one libcontainer container. Its methods translate libcontainer's errors into
// containerd errdefs so the task service can hand them to containerd unchanged.
type Container struct {
	lc    *libcontainer.Container
	root  string
	guard *initGuard // the live init an exec may join
	ready readyCRIU  // CRIU started ahead of the next dump (criuready.go)
	// execd: init was seen running the user's program (waitUserExec); it does not go back.
	execd atomic.Bool
}

// Create creates the container's state under root (nothing runs yet). A cgroup that still holds
// processes (another container's cgroupsPath) is refused here by libcontainer.
func Create(root, id string, cfg *configs.Config) (*Container, error) {
	lc, err := libcontainer.Create(root, id, cfg)
	if err != nil {
		return nil, wrap(fmt.Sprintf("create container %s (cgroup %s)", id, cgroupPath(cfg)), err)
	}
	giveCRIUVersion(lc)
	return &Container{lc: lc, root: root, guard: newInitGuard()}, nil
}

// Load opens an existing container's state (used by the shim's delete action).
func Load(root, id string) (*Container, error) {
	lc, err := libcontainer.Load(root, id)
	if err != nil {
		return nil, wrap("load container "+id, err)
	}
	giveCRIUVersion(lc)
	c := &Container{lc: lc, root: root, guard: newInitGuard()}
	if st, err := lc.Status(); err == nil && st != libcontainer.Stopped {
		// Best effort: a container loaded to be deleted needs no exec.
		_ = c.guard.hold(c.InitPid())
	}
	return c, nil
}

func cgroupPath(cfg *configs.Config) string {
	if cfg.Cgroups == nil {
		return ""
	}
	return cfg.Cgroups.Path
}

// Start runs the init process up to the point where it waits on libcontainer's exec fifo:
// the task API's Create. Release (task Start) lets it exec the user's program.
func (c *Container) Start(p *libcontainer.Process) error {
	p.Init = true
	if err := c.lc.Start(p); err != nil {
		return wrap("start container init", err)
	}
	return c.guard.hold(c.InitPid())
}

// Release lets a created init exec the user's program.
func (c *Container) Release() error {
	return wrap("start container", c.lc.Exec())
}

// Exec runs an additional process in the container's namespaces and cgroup: those of its live
// init, verified through its pidfd (initGuard), never of a pid that may be gone or reused.
func (c *Container) Exec(p *libcontainer.Process) error {
	p.Init = false
	if err := c.verifyInit(); err != nil {
		return fmt.Errorf("exec process: %w", err)
	}
	return wrap("exec process", c.lc.Run(p))
}

// Signal signals the init process, or with all every process of the container's cgroup.
func (c *Container) Signal(sig syscall.Signal, all bool) error {
	if !all {
		err := c.lc.Signal(sig)
		if errors.Is(err, libcontainer.ErrNotRunning) || errors.Is(err, os.ErrProcessDone) || errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("process already finished: %w", errdefs.ErrNotFound)
		}
		return wrap("signal init", err)
	}
	pids, err := c.lc.Processes()
	if err != nil {
		return wrap("list container processes", err)
	}
	for _, pid := range pids {
		if err := unix.Kill(pid, sig); err != nil && err != unix.ESRCH {
			return fmt.Errorf("signal %d: %w", pid, err)
		}
	}
	if sig == unix.SIGKILL && c.Paused() {
		// A frozen cgroup v1 task does not die until thawed.
		return c.Resume()
	}
	return nil
}

// Pause freezes the container's cgroup, retrying for a while (freeze.go). It first waits for
// init to exec the user's program (waitUserExec): the Go client pauses a task before it
// checkpoints it, and a task checkpointed right after its start was frozen still in libcontainer's
// init, which then could not exec until the thaw; the dump that followed found the shim's binary
// mapped and failed (TestConcurrentCheckpoints, 1 run in 3).
func (c *Container) Pause() error {
	c.waitUserExec(execWaitLimit)
	return wrap("pause", retryFreeze(c.lc.Pause, freezeTimeout))
}

// Resume thaws the container's cgroup.
func (c *Container) Resume() error { return wrap("resume", c.lc.Resume()) }

// Paused reports whether the container's cgroup is frozen.
func (c *Container) Paused() bool {
	st, err := c.lc.Status()
	return err == nil && st == libcontainer.Paused
}

// Pids lists the processes in the container's cgroup.
func (c *Container) Pids() ([]int, error) {
	pids, err := c.lc.Processes()
	return pids, wrap("list container processes", err)
}

// Resources are the cgroup limits the container has: its spec's, with every Update applied (nil
// without cgroup resources).
func (c *Container) Resources() *cgroups.Resources {
	if cg := c.lc.Config().Cgroups; cg != nil {
		return cg.Resources
	}
	return nil
}

// Update applies new linux resources to the container's cgroup.
func (c *Container) Update(r specs.LinuxResources) error {
	cfg := c.lc.Config()
	if cfg.Cgroups == nil || cfg.Cgroups.Resources == nil {
		return fmt.Errorf("container has no cgroup resources: %w", errdefs.ErrFailedPrecondition)
	}
	ApplyResources(cfg.Cgroups.Resources, r)
	return wrap("update resources", c.lc.Set(cfg))
}

// OOM returns a channel that receives a value on every OOM kill in the container's cgroup and is
// closed when the cgroup goes away.
func (c *Container) OOM() (<-chan struct{}, error) {
	ch, err := c.lc.NotifyOOM()
	return ch, wrap("watch OOM", err)
}

// Destroy removes the container's cgroup and state; the container must not be running.
// It kills what is left (processes in a shared PID namespace) first.
func (c *Container) Destroy() error {
	c.endLeftovers()
	// A restore killed halfway leaves libcontainer's bind mount of the rootfs for CRIU in the
	// state directory, which Destroy could then not remove.
	if err := unix.Unmount(filepath.Join(c.root, c.lc.ID(), "criu-root"), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("destroy container: unmount criu-root: %w", err)
	}
	return wrap("destroy container", c.lc.Destroy())
}

// Vacate removes the stopped container's cgroups and state as Destroy does, without running its
// poststop hooks: the container lives on in the engine a restore in place makes (a rollback, the
// in-place cycle of a checkpoint), whose Destroy at the task's delete runs them once. libcontainer's
// Destroy always runs them, and nerdctl's (its CNI teardown: the address released to IPAM, the
// port mappings removed, the container's name freed) would leave the restored task with an
// address another container can be given and ports that no longer forward.
func (c *Container) Vacate() error {
	c.endLeftovers()
	return errors.Join(removeCgroup(c.lc.Config().Cgroups), removeState(filepath.Join(c.root, c.lc.ID())))
}

// endLeftovers lets go of the init and of the CRIU started ahead of a dump, and kills what is
// left of a container about to be removed.
func (c *Container) endLeftovers() {
	c.ready.end()
	c.guard.drop()
	if st, err := c.lc.Status(); err == nil && st != libcontainer.Stopped {
		_ = c.lc.Signal(unix.SIGKILL)
		c.waitStopped(2 * time.Second)
	}
}

// waitStopped polls like `runc delete --force` does until init is gone.
func (c *Container) waitStopped(limit time.Duration) {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, err := c.lc.Status(); err != nil || st == libcontainer.Stopped {
			return
		}
	}
}

// InitPid is the pid of the container's init, or 0.
func (c *Container) InitPid() int {
	st, err := c.lc.State()
	if err != nil {
		return 0
	}
	return st.InitProcessPid
}

// wrap names the operation and maps libcontainer's sentinel errors onto errdefs.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var kind error
	switch {
	case errors.Is(err, libcontainer.ErrExist):
		kind = errdefs.ErrAlreadyExists
	case errors.Is(err, libcontainer.ErrNotExist):
		kind = errdefs.ErrNotFound
	case errors.Is(err, libcontainer.ErrInvalidID):
		kind = errdefs.ErrInvalidArgument
	case errors.Is(err, libcontainer.ErrRunning), errors.Is(err, libcontainer.ErrNotRunning),
		errors.Is(err, libcontainer.ErrPaused), errors.Is(err, libcontainer.ErrNotPaused):
		kind = errdefs.ErrFailedPrecondition
	}
	if kind != nil && !errors.Is(err, kind) {
		return fmt.Errorf("%s: %w: %w", op, err, kind)
	}
	return fmt.Errorf("%s: %w", op, err)
}
