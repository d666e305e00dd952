package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/ckimage"
	"github.com/cklite/cklite/runtime"
	"github.com/cklite/cklite/snapshotter/capture"
)

// container is one task: its engine container, rootfs mounts, init and execs.
type container struct {
	id, bundle string
	rootfs     string // <bundle>/rootfs when the shim mounted it, unmounted on delete
	// captured is the last capture of the rootfs upper (capture.go), for the next one to write
	// only what changed; nil whenever the upper is not the one it recorded. Under the lifecycle lock.
	captured *capture.Record
	// saves are the records being saved beside the upper (capture.go): a delete waits for them.
	saves      sync.WaitGroup
	opts       *options.Options
	eng        engine // read through engine(): an in-place checkpoint or rollback replaces it
	init       *process
	checkpoint string // image directory to restore from at Start, if created from a checkpoint
	// startRestoring: Start is restoring the init from that checkpoint (State does not wait for it)
	startRestoring atomic.Bool
	// rolledBack: a rollback in place has run; the restore copies of its later checkpoints are
	// made ahead, in the background (pagededup.go)
	rolledBack atomic.Bool
	fromImage  bool // that checkpoint came with the container's image: its rootfs is the checkpoint's
	// admitMounted: the checkpoint's images are admitted once the rootfs is mounted (prepareRestore)
	admitMounted bool
	dumped       checkpoint.DumpFlags // the CRIU options that checkpoint was dumped with
	withInit     bool                 // its PID 1 is cklite's init (init.go)
	initBuild    string               // the Go build id of the init's binary (initbuild.go)
	netns        *os.File             // a new network namespace for that restore, held until it is done
	execStdio    *treeHold            // stand-ins for the stdio of its exec'd processes, likewise
	spec         *specs.Spec
	cfgOpts      runtime.ConfigOptions
	stateRoot    string
	sharedPid    bool        // no private PID namespace: init's exit does not take the others along
	reaping      reapCheck   // whether its PID 1 reaps the execs of its tree (reapcheck.go)
	standIns     ttyStandIns // the terminals of its restored processes that have no exec id (exectty.go)
	cgroup       *runtime.Cgroup
	// cgroupOf loads a process's cgroup: runtime.LoadCgroup, a fake in unit tests.
	cgroupOf func(pid int) (*runtime.Cgroup, error)

	// lifecycle serialises every call that acts on the init or the engine (runc-v2's Init.mu): a
	// checkpoint or rollback holds it from its first check to its last step, and a call that
	// arrives meanwhile waits for it (see doc.go).
	lifecycle lifecycleLock
	// finishing is the work a rollback left for after its answer (the replaced rootfs key's
	// removal): the container's delete waits for it.
	finishing sync.WaitGroup
	// newEngine creates the engine for a configuration (createEngine; a fake in unit tests).
	newEngine func(adjust func(*configs.Config) error) (engine, error)

	mu           sync.Mutex
	execs        map[string]*process
	runningExecs int
	initExited   bool
	deleting     bool // a Delete of init is under way: a second one is refused
	// restoreCancel ends the restore under way, if any (beginRestore).
	restoreCancel context.CancelCauseFunc
	execsDone     *sync.Cond // signalled when runningExecs drops
}

// newContainer mounts the rootfs, converts the spec and creates the container with its init
// waiting on libcontainer's exec fifo (or, with a checkpoint, ready to be restored at Start).
// Nothing is left behind on failure: no mount, no cgroup, no state, no process.
func (s *service) newContainer(ctx context.Context, r *taskAPI.CreateTaskRequest) (_ *container, retErr error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	opts, err := decodeOptions(r.Options)
	if err != nil {
		return nil, err
	}
	if opts.CriuImagePath != "" && r.Checkpoint == "" {
		r.Checkpoint = opts.CriuImagePath
	}
	spec, err := runtime.LoadSpec(r.Bundle)
	if err != nil {
		return nil, err
	}
	if err := writeOptions(r.Bundle, opts); err != nil {
		return nil, fmt.Errorf("record options in bundle: %w", err)
	}
	c := &container{
		id:         r.ID,
		bundle:     r.Bundle,
		opts:       opts,
		checkpoint: r.Checkpoint,
		spec:       spec,
		cfgOpts:    runtime.ConfigOptions{ID: r.ID, NoPivotRoot: opts.NoPivotRoot, NoNewKeyring: opts.NoNewKeyring},
		stateRoot:  stateRoot(opts, ns),
		sharedPid:  !privatePidNS(spec),
		cgroupOf:   runtime.LoadCgroup,
		execs:      make(map[string]*process),
		init: newProcess(r.ID, true, stdio{
			Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal,
		}),
	}
	c.execsDone = sync.NewCond(&c.mu)
	c.newEngine = c.createEngine
	if c.hasLeftovers() {
		if _, err := recoverContainer(ctx, c.bundle, c.stateRoot, c.id); err != nil {
			return nil, fmt.Errorf("container %s: what a killed shim left behind cannot be removed: %w", c.id, err)
		}
	}
	if c.checkpoint == "" && spec.Process != nil && ckimage.IsMarker(spec.Process.Args) {
		if c.checkpoint, err = s.imageCheckpoint(ctx, ns, r.ID, spec); err != nil {
			return nil, err
		}
		c.fromImage = true
	}
	if err := s.setInit(c); err != nil {
		return nil, err
	}

	// libcontainer and mount helpers fork: keep the orphan reaper off their children.
	release := s.reaper.hold()
	defer release()
	rootfs := requestMounts(r)
	if c.checkpoint != "" {
		if rootfs, err = s.prepareRestore(ctx, ns, c, rootfs); err != nil {
			return nil, err
		}
	}
	if err := c.mountRootfs(rootfs); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			c.unmountRootfs(ctx)
		}
	}()
	if c.admitMounted {
		if err := s.admit(c.checkpoint, c.spec, c.rootfs); err != nil {
			return nil, err
		}
	}
	eng, err := c.newEngine(c.restoreConfig)
	if err != nil {
		c.closeNetNS()
		return nil, err
	}
	c.setEngine(eng)
	defer func() {
		if retErr != nil {
			if err := eng.Destroy(); err != nil {
				log.G(ctx).WithError(err).Warn("destroy half-created container")
			}
		}
	}()
	c.init.spec = spec.Process
	if c.checkpoint != "" {
		return c, nil
	}
	if err := s.startInit(ctx, c, eng.Start, statusCreated); err != nil {
		return nil, err
	}
	return c, nil
}

// privatePidNS reports whether the container gets a PID namespace of its own (killing its init
// then kills everything in it).
func privatePidNS(spec *specs.Spec) bool {
	if spec.Linux == nil {
		return false
	}
	for _, n := range spec.Linux.Namespaces {
		if n.Type == specs.PIDNamespace {
			return n.Path == ""
		}
	}
	return false
}

// createEngine converts the spec and creates the libcontainer container (its state and cgroup),
// with the configuration changed by adjust if given.
func (c *container) createEngine(adjust func(*configs.Config) error) (engine, error) {
	cfg, err := runtime.NewConfig(c.bundle, c.spec, c.cfgOpts)
	if err != nil {
		return nil, err
	}
	// An engine made again for the same task (a rollback, the in-place cycle of a checkpoint) has
	// the limits the task had, not the spec's: the kubelet's resize or `nerdctl update` stays.
	if old := c.engine(); old != nil && cfg.Cgroups != nil {
		if res := old.Resources(); res != nil {
			cfg.Cgroups.Resources = res
		}
	}
	if adjust != nil {
		if err := adjust(cfg); err != nil {
			return nil, err
		}
	}
	e, err := runtime.Create(c.stateRoot, c.id, cfg)
	if err != nil {
		return nil, err // no typed nil in the interface
	}
	return e, nil
}

func requestMounts(r *taskAPI.CreateTaskRequest) []mount.Mount {
	var mounts []mount.Mount
	for _, m := range r.Rootfs {
		mounts = append(mounts, mount.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options})
	}
	return mounts
}

// mountRootfs mounts the rootfs at <bundle>/rootfs, like runc-v2.
func (c *container) mountRootfs(mounts []mount.Mount) error {
	if len(mounts) == 0 {
		return nil
	}
	rootfs := filepath.Join(c.bundle, "rootfs")
	if err := os.Mkdir(rootfs, 0o711); err != nil && !os.IsExist(err) {
		return fmt.Errorf("create rootfs mountpoint: %w", err)
	}
	if err := mount.All(mounts, rootfs); err != nil {
		_ = mount.UnmountMounts(mounts, rootfs, 0)
		return fmt.Errorf("mount rootfs at %s: %w", rootfs, err)
	}
	c.rootfs = rootfs
	return nil
}

func (c *container) unmountRootfs(ctx context.Context) error {
	if c.rootfs == "" {
		return nil
	}
	if err := mount.UnmountRecursive(c.rootfs, 0); err != nil {
		log.G(ctx).WithError(err).WithField("rootfs", c.rootfs).Warn("unmount rootfs")
		return fmt.Errorf("unmount rootfs %s: %w", c.rootfs, err)
	}
	return nil
}

// detachRootfs unmounts the rootfs, whose upper is to be discarded, and leaves the end of its
// mount to release, for the caller to run off the task's path. The end of an overlay mount is the
// costly part of its unmount: overlayfs syncs the whole filesystem of its upper (here the host's
// disk, with whatever anyone wrote to it), and the kernel drops every dentry and inode the mount
// cached (thousands once a project has been read through it: a tree search's rollback unmounted
// in 15-18 ms where an idle container's takes 1.5). The mount is detached (MNT_DETACH) while a
// descriptor of it is held: the path is free at once, nothing can reach the old mount through it,
// and the mount ends when release closes the descriptor (or when the shim dies). Only for an
// upper nothing reads again: while the old mount lives it still holds its upper, so the same key
// must not be mounted again before release (a memory-only rollback keeps the key: unmountRootfs).
func (c *container) detachRootfs(ctx context.Context) (release func(), err error) {
	release = func() {}
	if c.rootfs == "" {
		return release, nil
	}
	fd, err := unix.Open(c.rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return release, c.unmountRootfs(ctx)
	}
	// Until nothing is mounted there (EINVAL): the descriptor holds the topmost mount.
	for {
		err := unix.Unmount(c.rootfs, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) {
			return func() { unix.Close(fd) }, nil
		}
		if err != nil {
			unix.Close(fd)
			log.G(ctx).WithError(err).WithField("rootfs", c.rootfs).Warn("unmount rootfs")
			return release, fmt.Errorf("unmount rootfs %s: %w", c.rootfs, err)
		}
	}
}

// startInit starts (create) or restores the init process through run, wiring its stdio.
// The caller holds the reaper.
func (s *service) startInit(ctx context.Context, c *container, run func(*libcontainer.Process) error, st status) error {
	lp, err := runtime.NewProcess(c.init.spec)
	if err != nil {
		return err
	}
	return s.launch(ctx, c, c.init, lp, run, st)
}

// launch runs lp through run with the process's stdio, and records the process in state st.
// The caller holds the reaper: the new pid is owned before the reaper may run again.
func (s *service) launch(ctx context.Context, c *container, p *process, lp *libcontainer.Process, run func(*libcontainer.Process) error, st status) (retErr error) {
	pio, err := newProcessIO(ctx, c.id, p.stdio, int(c.opts.IoUid), int(c.opts.IoGid), s.reaper)
	if err != nil {
		return fmt.Errorf("create process stdio: %w", err)
	}
	defer func() {
		if retErr != nil {
			pio.Close()
		}
	}()
	restoring := p.init && c.checkpoint != ""
	if restoring {
		if err := pio.nullPipes(ctx, int(c.opts.IoUid), int(c.opts.IoGid)); err != nil {
			return err
		}
	}
	pio.wire(lp)
	var cs *consoleSocket
	if p.stdio.Terminal || restoring {
		if cs, err = newConsoleSocket(); err != nil {
			return err
		}
		defer cs.Close()
		lp.ConsoleSocket = cs.child
	}
	if err := run(lp); err != nil {
		return err
	}
	pid, err := lp.Pid()
	if err != nil {
		return fmt.Errorf("pid of started process: %w", err)
	}
	s.reaper.own(pid)
	pio.started()
	p.setIO(pio)
	if cs != nil {
		if err := s.takeConsole(ctx, p, pio, cs, restoring); err != nil {
			return s.abort(p, lp, pid, err)
		}
	}
	if err := p.started(lp, pid, st); err != nil {
		return s.abort(p, lp, pid, err)
	}
	return nil
}

// abort kills and reaps a process whose stdio could not be wired.
func (s *service) abort(p *process, lp *libcontainer.Process, pid int, cause error) error {
	_ = lp.Signal(os.Kill)
	_, _ = lp.Wait()
	s.reaper.disown(pid)
	p.mu.Lock()
	p.io = nil
	p.mu.Unlock()
	return cause
}

// newExec registers an exec process (it runs at Start, like runc-v2).
func (c *container) newExec(r *taskAPI.ExecProcessRequest) (*process, error) {
	if err := c.init.expect("exec in", statusCreated, statusRunning); err != nil {
		return nil, err
	}
	var spec specs.Process
	if r.Spec == nil {
		return nil, fmt.Errorf("exec %s has no process spec: %w", r.ExecID, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(r.Spec.Value, &spec); err != nil {
		return nil, fmt.Errorf("exec %s: invalid process spec: %w: %w", r.ExecID, err, errdefs.ErrInvalidArgument)
	}
	spec.Terminal = r.Terminal
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.execs[r.ExecID]; ok || r.ExecID == "" {
		return nil, fmt.Errorf("exec id %q: %w", r.ExecID, errdefs.ErrAlreadyExists)
	}
	p := newProcess(r.ExecID, false, stdio{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal})
	p.spec = &spec
	c.execs[r.ExecID] = p
	return p, nil
}

// process returns init for "" or the exec with that id.
func (c *container) process(execID string) (*process, error) {
	if execID == "" {
		return c.init, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.execs[execID]
	if !ok {
		return nil, fmt.Errorf("process does not exist %s: %w", execID, errdefs.ErrNotFound)
	}
	return p, nil
}

func (c *container) execPids() map[int]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[int]string, len(c.execs))
	for id, p := range c.execs {
		if pid := p.getPid(); pid > 0 {
			m[pid] = id
		}
	}
	return m
}
