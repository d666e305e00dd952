package shim

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/runtime"
)

// inPlace is the cycle a checkpoint that leaves the task running and a rollback share, written
// once: hold the task's stdio (and its network namespace) → stop its processes (a CRIU dump, or
// a kill) → destroy the engine and unmount the rootfs → switch the rootfs (freeze it into the
// checkpoint, or stack it on the checkpoint's layer) → restore the processes from the CRIU
// images into a new engine, on the same stdio and network → if the restore fails, publish the
// init's exit: the task is then stopped, never half there. The caller holds the container's
// lifecycle lock and the reaper.
type inPlace struct {
	s    *service
	c    *container
	what string // "checkpoint" or "rollback", for logs

	sn  snapshots.Snapshotter
	key string // the container's rootfs snapshot
	// mounts, if set, are key's, as the switch that prepared it answered: the remount does not
	// ask the snapshotter for them again.
	mounts []mount.Mount

	dump    checkpoint.DumpFlags   // how the images to restore were dumped
	restore runtime.CheckpointOpts // CRIU's options for their restore

	// stop ends the task's processes: CRIU's dump, or a kill.
	stop func() error
	// switchRootfs changes the rootfs while no process runs and it is unmounted.
	switchRootfs func(ctx context.Context) error
	// discards says that switchRootfs replaces the rootfs's key: the old mount's upper is not read
	// again, and its unmount leaves the end of the mount to inPlaceResult.release.
	discards bool
	// restoreAnyway restores even when the engine could not be destroyed or the rootfs could not
	// be switched: a checkpoint's fresh dump is still the task (it runs on, the checkpoint
	// failed), where a rollback's images on the wrong rootfs would not be.
	restoreAnyway bool
	// exit leaves the task stopped once the rootfs is switched (Checkpoint with Exit).
	exit bool
	// t, if set, times the cycle's steps for the caller's log line.
	t *steps
}

// mark ends the step name of the caller's steps, if it times them.
func (ip *inPlace) mark(name string) {
	if ip.t != nil {
		ip.t.mark(name)
	}
}

// inPlaceResult is how the cycle ended: switched is switchRootfs's (or the teardown's) failure,
// stopped is set when the task did not come back and its exit was published. release ends the
// discarded rootfs's mount (container.detachRootfs): the caller runs it once it has answered,
// before anything else uses the old key.
type inPlaceResult struct {
	switched error
	stopped  error
	release  func()
}

// run runs the cycle. An error means nothing was stopped (the task runs as it did, unless it
// exited meanwhile, which is then published).
func (ip *inPlace) run(ctx context.Context) (inPlaceResult, error) {
	c := ip.c
	held, err := holdTask(c, ip.dump.ExternalNetNS, ip.holdExecs)
	if err != nil {
		return inPlaceResult{}, err
	}
	defer held.Close()
	ip.mark("hold")
	eng := c.engine()
	paused := eng.Paused()
	pid := c.init.getPid()
	exited := c.init.beginHandover()
	start := time.Now()
	if err := ip.stop(); err != nil {
		// CRIU resumes the tasks when a dump fails, and a failed kill killed nothing: nothing
		// changed, but for an exit that came meanwhile.
		held.execs.settle(ip.s, c)
		if code, gone := c.init.endHandover(); gone {
			ip.s.initExited(c, c.init, pid, code)
		}
		return inPlaceResult{}, err
	}
	code := ip.stoppedExit(ctx, exited)
	stopped := time.Since(start)
	ip.mark("kill")
	// The rootfs is about to get another upper: the last capture recorded this one.
	c.captured = nil

	res := inPlaceResult{release: func() {}}
	// The CRIU the old engine started ahead of its next dump serves the new engine's.
	kept := eng.KeepReadyCRIU()
	res.switched = eng.Vacate() // its poststop hooks run at the task's delete, once
	ip.mark("destroy")
	if res.switched == nil {
		if ip.discards {
			res.release, res.switched = c.detachRootfs(ctx)
		} else {
			res.switched = c.unmountRootfs(ctx)
		}
		ip.mark("unmount")
	}
	if res.switched == nil {
		if !ip.exit {
			// The restore's first cgroup attach waits for a grace period: started now, it runs
			// beside the switch (runtime.WarmAttach). Not before the engine's destroy: the write
			// that waits holds the cgroup mutex, which the removal of its cgroups needs.
			runtime.WarmAttach()
		}
		res.switched = ip.switchRootfs(ctx)
		ip.mark("switch")
	}
	switched := time.Since(start) - stopped
	exits := ip.exit && res.switched == nil // what the client asked for
	switch {
	case exits:
		if err := ip.remount(ctx); err != nil {
			log.G(ctx).WithError(err).Warn("remount rootfs of the exited task")
		}
	case res.switched != nil && !ip.restoreAnyway:
		res.stopped = res.switched
	default:
		if _, res.stopped = c.init.transition(ip.what, statusRestoring); res.stopped == nil {
			res.stopped = ip.restoreTask(ctx, held, paused)
		}
	}
	held.execs.settle(ip.s, c)
	c.init.endHandover()
	ip.mark("started")
	if exits || res.stopped != nil {
		kept.End()
		ip.s.initExited(c, c.init, pid, code)
		return res, nil
	}
	c.engine().AdoptReadyCRIU(kept)
	log.G(ctx).WithFields(log.Fields{
		"stop": stopped, "switch": switched, "restore": time.Since(start) - stopped - switched,
	}).Infof("%s: task restored in place", ip.what)
	return res, nil
}

// stoppedExit waits for the exit of the init the cycle has just stopped. Should CRIU leave the
// processes alive instead (a CRIU configuration that says leave-stopped or leave-running), the
// cycle must not wait forever: they are killed, as the dump would have.
func (ip *inPlace) stoppedExit(ctx context.Context, exited <-chan int) int {
	select {
	case code := <-exited:
		return code
	case <-time.After(5 * time.Second):
	}
	log.G(ctx).Warn("the dumped processes are still alive after the dump: killing them (a CRIU configuration with leave-stopped or leave-running?)")
	if err := ip.c.engine().Signal(unix.SIGKILL, true); err != nil {
		log.G(ctx).WithError(err).Error("kill the dumped processes")
	}
	return <-exited
}

// remount mounts the container's snapshot key again at <bundle>/rootfs.
func (ip *inPlace) remount(ctx context.Context) error {
	if ip.mounts != nil {
		return ip.c.mountRootfs(ip.mounts)
	}
	mounts, err := ip.sn.Mounts(ctx, ip.key)
	if err != nil {
		return fmt.Errorf("mounts of %s: %w", ip.key, err)
	}
	return ip.c.mountRootfs(mounts)
}

// restoreTask brings the stopped processes back in the same container, on the rootfs's current
// layers, with the stdio and network namespace held for them; paused, if they were.
func (ip *inPlace) restoreTask(ctx context.Context, hold *taskHold, paused bool) error {
	c := ip.c
	if err := ip.remount(ctx); err != nil {
		return err
	}
	ip.mark("mount")
	eng, err := c.newEngine(func(cfg *configs.Config) error {
		// The container's hooks ran when it was created; run again, a CNI hook would add a
		// second interface to the namespace that still has the first. Its poststop hooks are
		// the task's delete's: this engine is the one deleted then.
		cfg.Hooks = configs.Hooks{configs.Poststop: cfg.Hooks[configs.Poststop]}
		if named, _ := runtime.SpecNetNS(cfg); hold.netns != nil && !named {
			runtime.WithNetNS(cfg, hold.netns)
		}
		opts := append(dumpCRIUOptions(ip.dump), hold.execs.options...)
		if paused {
			// The client paused the task around the checkpoint and will resume it: it must
			// not run between CRIU's restore and the freeze.
			opts = append(opts, runtime.LeaveStopped)
		}
		if len(opts) == 0 {
			return nil
		}
		return runtime.WithCRIUOptions(cfg, ip.restore.WorkPath, opts...)
	})
	if err != nil {
		return err
	}
	ip.mark("engine")
	lp, err := runtime.NewProcess(c.init.spec)
	if err != nil {
		return err
	}
	if err := hold.stdio.attach(lp); err != nil {
		_ = eng.Vacate()
		return err
	}
	rctx, limits, end, err := c.beginRestore(ctx, ip.s.config)
	if err != nil {
		_ = eng.Vacate()
		return err
	}
	if ip.restoreAnyway {
		// The checkpoint's own fresh dump, of processes that were running a moment ago: a limit
		// meant for images from elsewhere would turn a checkpoint into a stopped task. A Kill
		// or Delete still ends it.
		limits = runtime.RestoreLimits{}
	}
	ip.mark("stdio")
	err = eng.Restore(rctx, lp, ip.restore, limits)
	end()
	ip.mark("restore")
	if err != nil {
		_ = eng.Vacate()
		return keepRestoreLog(c.bundle, ip.restore.WorkPath, err)
	}
	pid, err := lp.Pid()
	if err == nil {
		err = hold.stdio.restored(ctx)
	}
	if err != nil {
		// Nobody would see its terminal: the task ends stopped, as if the restore had failed.
		_ = lp.Signal(os.Kill)
		_, _ = lp.Wait()
		_ = eng.Vacate()
		return err
	}
	ip.s.reaper.own(pid)
	c.setEngine(eng)
	if pids, err := eng.Pids(); err == nil {
		hold.execs.reattach(ctx, ip.s, c, pids)
	}
	if err := c.init.started(lp, pid, statusRunning); err != nil {
		return err
	}
	ip.s.watchInit(ctx, c)
	if paused {
		if err := eng.PauseStopped(); err != nil {
			return err
		}
		if _, err := c.init.transition("pause", statusPaused); err != nil {
			return err
		}
	}
	return nil
}

// taskHold is what an in-place cycle gives back to a task whose processes are gone: its stdio
// and, when the dump left it out, its network namespace, held open meanwhile so that neither goes
// away with the processes.
type taskHold struct {
	stdio *heldStdio
	netns *os.File
	execs *treeHold
}

func holdTask(c *container, netns bool, execs func() (*treeHold, error)) (*taskHold, error) {
	stdio, err := holdStdio(c.init, c.engine())
	if err != nil {
		return nil, err
	}
	h := &taskHold{stdio: stdio}
	if netns {
		if h.netns, err = runtime.OpenNetNS(c.init.getPid()); err != nil {
			h.Close()
			return nil, err
		}
	}
	if h.execs, err = execs(); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

func (h *taskHold) Close() {
	h.stdio.Close()
	h.execs.Close()
	if h.netns != nil {
		h.netns.Close()
	}
}
