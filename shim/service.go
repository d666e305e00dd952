package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/console"
	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/runtime"
)

var (
	_     = shim.TTRPCService(&service{})
	empty = &ptypes.Empty{}
)

// ioDrainTimeout bounds how long Delete waits for a process's output to be copied out.
const ioDrainTimeout = 10 * time.Second

// service implements containerd's task API v3 for the containers of one shim.
type service struct {
	ctx      context.Context
	events   *eventQueue
	reaper   *reaper
	shutdown shutdown.Service
	daemon   daemonClient
	config   shimConfig
	// admit checks a CRIU image directory before a restore from it, the spec's mount
	// destinations resolved in rootfs when it is mounted (admitChain; unit tests, whose images
	// hold no processes, check only that they are complete).
	admit func(dir string, spec *specs.Spec, rootfs string) error

	mu         sync.Mutex
	containers map[string]*container
}

func newService(ctx context.Context, publisher shim.Publisher, sd shutdown.Service, containerdAddress string) (*service, error) {
	s := &service{
		ctx:        ctx,
		daemon:     &daemon{address: containerdAddress},
		events:     newEventQueue(ctx, publisher, sd),
		reaper:     newReaper(),
		shutdown:   sd,
		containers: make(map[string]*container),
		config:     loadShimConfig(ctx),
	}
	s.admit = s.admitChain
	// Once, here, rather than on the first checkpoint: CRIU's lookup and its kerndat cache (a
	// tmpfs mount) are the shim's start-up, never a side effect of a call. CRIU's feature check
	// runs in the background, the reaper held until it has been waited for.
	if err := runtime.PrepareCRIU(s.reaper.hold()); err != nil {
		log.G(ctx).WithError(err).Warn("checkpoint and restore will fail")
	}
	// The CRIU started ahead of a container's next dump is the shim's child between calls.
	runtime.KeepCRIUChildren(runtime.CRIUChildren{Hold: s.reaper.hold, Own: s.reaper.own, Disown: s.reaper.disown})
	s.reaper.run(ctx)
	sd.RegisterCallback(func(context.Context) error { s.daemon.close(); return nil })
	if address, err := shim.ReadAddress("address"); err == nil {
		sd.RegisterCallback(func(context.Context) error { return shim.RemoveSocket(address) })
	}
	return s, nil
}

// RegisterTTRPC registers the task service on the shim's ttrpc server.
func (s *service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, s)
	return nil
}

func (s *service) get(id string) (*container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.containers[id]
	if !ok {
		return nil, errgrpc.ToGRPCf(errdefs.ErrNotFound, "container %s not created", id)
	}
	return c, nil
}

func (s *service) getProcess(id, execID string) (*container, *process, error) {
	c, err := s.get(id)
	if err != nil {
		return nil, nil, err
	}
	p, err := c.process(execID)
	if err != nil {
		return nil, nil, errgrpc.ToGRPC(err)
	}
	return c, p, nil
}

// Create a container and its init process (created, not started).
func (s *service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	s.mu.Lock()
	_, exists := s.containers[r.ID]
	s.mu.Unlock()
	if exists {
		return nil, errgrpc.ToGRPCf(errdefs.ErrAlreadyExists, "container %s already exists in this shim", r.ID)
	}
	c, err := s.newContainer(ctx, r)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	s.mu.Lock()
	s.containers[r.ID] = c
	s.mu.Unlock()

	pid := c.init.getPid()
	s.events.send(&eventstypes.TaskCreate{
		ContainerID: r.ID,
		Bundle:      r.Bundle,
		Rootfs:      r.Rootfs,
		IO:          &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		Checkpoint:  r.Checkpoint,
		Pid:         uint32(pid),
	})
	if pid > 0 {
		s.watchInit(ctx, c)
	}
	return &taskAPI.CreateTaskResponse{Pid: uint32(pid)}, nil
}

// watchInit starts collecting the init's exit and watching for OOM kills, right after the init
// exists (a process can be OOM-killed before Start).
func (s *service) watchInit(ctx context.Context, c *container) {
	if _, err := c.loadCgroup(); err != nil {
		log.G(ctx).WithError(err).Warn("load container cgroup for stats (Stats tries again)")
	}
	s.watchOOM(ctx, c)
	go s.collect(c, c.init)
}

// Start the init (or restore it from a checkpoint) or an exec.
func (s *service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	c, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if p.init {
		err = s.startContainer(ctx, c)
	} else {
		err = s.startExec(ctx, c, p)
	}
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &taskAPI.StartResponse{Pid: uint32(p.getPid())}, nil
}

func (s *service) startContainer(ctx context.Context, c *container) error {
	p := c.init
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	p.startMu.Lock()
	defer p.startMu.Unlock()
	if c.checkpoint != "" {
		if _, err := p.transition("start", statusRestoring); err != nil {
			return err
		}
		c.startRestoring.Store(true)
		err := s.restore(ctx, c)
		c.startRestoring.Store(false)
		if err != nil {
			p.settle(statusRestoring, statusCreated) // nothing runs: the task can be deleted
			return err
		}
	} else {
		if err := p.expect("start", statusCreated); err != nil {
			return err
		}
		release := s.reaper.hold()
		err := c.engine().Release()
		release()
		if err != nil {
			return err
		}
		// An init that exited at once is stopped already: its Start succeeded all the same.
		if _, err := p.transition("start", statusRunning); err != nil && p.status() != statusStopped {
			return err
		}
	}
	s.events.send(&eventstypes.TaskStart{ContainerID: c.id, Pid: uint32(p.getPid())})
	return nil
}

func (s *service) startExec(ctx context.Context, c *container, p *process) error {
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	if err := p.expect("start", statusCreated); err != nil {
		return err
	}
	c.mu.Lock()
	if c.initExited {
		c.mu.Unlock()
		return fmt.Errorf("container %s init process is not running: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	c.runningExecs++
	c.mu.Unlock()
	inTree := c.execsInTree(p)
	lp, err := runtime.NewProcess(p.spec)
	if err == nil {
		release := s.reaper.hold()
		if inTree {
			err = s.launchInTree(ctx, c, p, lp)
		} else {
			err = s.launch(ctx, c, p, lp, c.engine().Exec, statusRunning)
		}
		release()
	}
	if err != nil {
		c.execExited()
		return err
	}
	s.events.send(&eventstypes.TaskExecStarted{ContainerID: c.id, ExecID: p.id, Pid: uint32(p.getPid())})
	if inTree {
		go s.watchTree(c, p)
	} else {
		go s.collect(c, p)
	}
	return nil
}

// Delete a stopped (or never started) process; deleting init deletes the container.
func (s *service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	c, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if p.init {
		// A restore under way (CRIU under its watchdog) is ended rather than waited for, as
		// by a Kill: the task then ends stopped and is deleted.
		c.cancelRestore(fmt.Errorf("task deleted"))
	}
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	if err := p.expect("delete", statusCreated, statusStopped); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if p.init {
		if err = s.deleteContainer(ctx, c); errdefs.IsNotFound(err) {
			return nil, errgrpc.ToGRPC(err)
		}
	} else {
		c.mu.Lock()
		delete(c.execs, p.id)
		c.mu.Unlock()
		err = p.release(ioDrainTimeout)
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", p.id).Warn("delete")
	}
	code, at := p.exit()
	pid := p.getPid()
	if p.init {
		s.events.send(&eventstypes.TaskDelete{
			ContainerID: c.id, Pid: uint32(pid), ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at),
		})
	}
	return &taskAPI.DeleteResponse{Pid: uint32(pid), ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at)}, nil
}

// deleteContainer kills a created init, then removes everything the container holds.
func (s *service) deleteContainer(ctx context.Context, c *container) error {
	c.mu.Lock()
	deleting := c.deleting
	c.deleting = true
	c.mu.Unlock()
	if deleting {
		return fmt.Errorf("container %s is being deleted: %w", c.id, errdefs.ErrNotFound)
	}
	c.saves.Wait()
	c.finishing.Wait()
	if c.init.status() == statusCreated && c.init.getPid() > 0 {
		_ = c.engine().Signal(syscall.SIGKILL, false)
		waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = c.init.wait(waitCtx)
		cancel()
	}
	c.mu.Lock()
	execs := c.execs
	c.execs = map[string]*process{}
	c.mu.Unlock()
	for _, e := range execs {
		_ = e.release(0)
	}
	c.closeNetNS() // created, never started
	ioErr := c.init.release(ioDrainTimeout)
	release := s.reaper.hold() // poststop hooks fork
	err := c.engine().Destroy()
	release()
	if _, terr := c.init.transition("delete", statusDeleted); terr != nil {
		log.G(ctx).WithError(terr).Warn("delete")
	}
	s.mu.Lock()
	delete(s.containers, c.id)
	s.mu.Unlock()
	if uerr := c.unmountRootfs(ctx); err == nil {
		err = uerr
	}
	if err == nil {
		err = ioErr
	}
	return err
}

// Exec registers an additional process; it runs at Start.
func (s *service) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*ptypes.Empty, error) {
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	c.lifecycle.Lock()
	p, err := c.newExec(r)
	c.lifecycle.Unlock()
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	s.events.send(&eventstypes.TaskExecAdded{ContainerID: c.id, ExecID: p.id})
	return empty, nil
}

// ResizePty resizes a process's console.
func (s *service) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*ptypes.Empty, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if err := p.resize(console.WinSize{Width: uint16(r.Width), Height: uint16(r.Height)}); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return empty, nil
}

// State of a process.
func (s *service) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	c, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	st := p.status()
	switch {
	case p.init && c.startRestoring.Load():
		// Not started yet, and not waited for: containerd gives State 2 s (its stateTimeout),
		// a restore may take longer, and the logging binary the restore starts (nerdctl's) asks
		// for the task meanwhile and, refused, stops logging for good.
		st = statusCreated
	case p.init:
		c.lifecycle.Lock()
		if st = p.status(); st == statusRunning && c.engine().Paused() {
			st = statusPaused
		}
		c.lifecycle.Unlock()
	}
	code, at := p.exit()
	return &taskAPI.StateResponse{
		ID:         p.id,
		Bundle:     c.bundle,
		Pid:        uint32(p.getPid()),
		Status:     st.task(),
		Stdin:      p.stdio.Stdin,
		Stdout:     p.stdio.Stdout,
		Stderr:     p.stdio.Stderr,
		Terminal:   p.stdio.Terminal,
		ExitStatus: uint32(code),
		ExitedAt:   protobuf.ToTimestamp(at),
	}, nil
}

// Pause freezes the container.
func (s *service) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*ptypes.Empty, error) {
	return s.setPaused(ctx, r.ID, true)
}

// Resume thaws the container.
func (s *service) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*ptypes.Empty, error) {
	return s.setPaused(ctx, r.ID, false)
}

// setPaused pauses or resumes the task's processes (the cgroup freezer): not to be confused with
// freezing a rootfs layer into a checkpoint (snapshotter/freeze).
func (s *service) setPaused(ctx context.Context, id string, pause bool) (*ptypes.Empty, error) {
	c, err := s.get(id)
	if err != nil {
		return nil, err
	}
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	from, to, op, do := statusRunning, statusPaused, "pause", c.engine().Pause
	if !pause {
		from, to, op, do = statusPaused, statusRunning, "resume", c.engine().Resume
	}
	if err := c.init.expect(op, from); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if pause {
		// What is typed on the terminal of a frozen task waits in the stdin FIFO rather than in
		// the pty, where a checkpoint, which kills the pty's process side, would lose it.
		c.init.holdInput()
	}
	if err := do(); err != nil {
		if pause {
			c.init.releaseInput()
		}
		return nil, errgrpc.ToGRPC(err)
	}
	if !pause {
		c.init.releaseInput()
	}
	if _, err := c.init.transition(op, to); err != nil {
		return nil, errgrpc.ToGRPC(err) // it exited meanwhile
	}
	if pause {
		s.events.send(&eventstypes.TaskPaused{ContainerID: c.id})
	} else {
		s.events.send(&eventstypes.TaskResumed{ContainerID: c.id})
	}
	return empty, nil
}

// Kill signals a process, or with All every process of the container.
func (s *service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*ptypes.Empty, error) {
	c, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	sig := syscall.Signal(r.Signal)
	if p.init && c.cancelRestore(fmt.Errorf("task killed (signal %d)", sig)) {
		// The restore fails and the task ends stopped: nothing else to signal.
		return empty, nil
	}
	if !p.init {
		err = p.signal(sig)
	} else {
		c.lifecycle.Lock()
		defer c.lifecycle.Unlock()
		switch st := p.status(); {
		case st == statusStopped || st == statusDeleted:
			err = fmt.Errorf("process already finished: %w", errdefs.ErrNotFound)
		case p.getPid() == 0:
			err = fmt.Errorf("container %s has no process yet: %w", c.id, errdefs.ErrNotFound)
		default:
			err = c.engine().Signal(sig, r.All)
		}
	}
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return empty, nil
}

// Pids lists the container's processes, exec processes annotated with their exec id.
func (s *service) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	c.lifecycle.Lock()
	pids, err := c.engine().Pids()
	c.lifecycle.Unlock()
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	execs := c.execPids()
	processes := make([]*task.ProcessInfo, 0, len(pids))
	for _, pid := range pids {
		info := &task.ProcessInfo{Pid: uint32(pid)}
		if id, ok := execs[pid]; ok {
			a, err := typeurl.MarshalAnyToProto(&options.ProcessDetails{ExecID: id})
			if err != nil {
				return nil, fmt.Errorf("marshal process %d info: %w", pid, err)
			}
			info.Info = a
		}
		processes = append(processes, info)
	}
	return &taskAPI.PidsResponse{Processes: processes}, nil
}

// CloseIO closes a process's stdin.
func (s *service) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*ptypes.Empty, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if r.Stdin {
		if err := p.closeStdin(); err != nil {
			return nil, errgrpc.ToGRPCf(errdefs.ErrUnknown, "close stdin: %v", err)
		}
	}
	return empty, nil
}

// Update the container's linux resources.
func (s *service) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*ptypes.Empty, error) {
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	if dir := r.Annotations[checkpoint.RollbackKey]; dir != "" {
		force := r.Annotations[checkpoint.ForceForeignKey] == "true"
		if err := s.rollbackInPlace(ctx, c, dir, force); err != nil {
			return nil, errgrpc.ToGRPC(err)
		}
		// A container rolled back is checkpointed again: its CRIU, beside the answer.
		c.engine().PrepareNextDump()
		return empty, nil
	}
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	if err := c.init.expect("update", statusCreated, statusRunning, statusPaused); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	var res specs.LinuxResources
	if r.Resources == nil {
		return nil, errgrpc.ToGRPCf(errdefs.ErrInvalidArgument, "update without resources")
	}
	if err := json.Unmarshal(r.Resources.Value, &res); err != nil {
		return nil, errgrpc.ToGRPCf(errdefs.ErrInvalidArgument, "resources of type %s are not linux resources: %v", r.Resources.TypeUrl, err)
	}
	if err := c.engine().Update(res); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return empty, nil
}

// Wait for a process to exit.
func (s *service) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if err := p.wait(ctx); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	code, at := p.exit()
	return &taskAPI.WaitResponse{ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at)}, nil
}

// Connect returns the shim's and the task's pids.
func (s *service) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	var pid int
	if c, err := s.get(r.ID); err == nil {
		pid = c.init.getPid()
	}
	return &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid()), TaskPid: uint32(pid)}, nil
}

// Shutdown stops the shim once it serves no container.
func (s *service) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*ptypes.Empty, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.containers) > 0 {
		return empty, nil
	}
	s.shutdown.Shutdown()
	return empty, nil
}
