package runtime

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/fault"
	"github.com/cklite/cklite/pkg/pagechain"
)

// CheckpointOpts are containerd's checkpoint options in engine terms.
type CheckpointOpts struct {
	ImagePath           string
	WorkPath            string
	Exit                bool
	OpenTCP             bool
	ExternalUnixSockets bool
	Terminal            bool
	FileLocks           bool
	EmptyNamespaces     []string
	CgroupsMode         string
	// KeepFrozen: a leave-running dump that succeeds returns with the task's cgroup frozen, for
	// the caller to capture what the dump does not hold (the rootfs) and thaw it. A dump that
	// fails returns with the task as it found it.
	KeepFrozen bool
}

// criu builds libcontainer's CriuOpts the way runc's checkpoint/restore commands do. It is pure:
// whether CRIU is there was settled once, by PrepareCRIU.
func (o CheckpointOpts) criu() (*libcontainer.CriuOpts, error) {
	if o.ImagePath == "" {
		return nil, fmt.Errorf("checkpoint image path is empty: %w", errdefs.ErrInvalidArgument)
	}
	// runc never checkpoints network devices, so the network namespace is always "empty":
	// the restored container gets a fresh one. Only the network namespace may be named.
	ns := uint32(unix.CLONE_NEWNET)
	for _, n := range o.EmptyNamespaces {
		if specs.LinuxNamespaceType(n) != specs.NetworkNamespace {
			return nil, fmt.Errorf("empty namespace %q is not supported: %w", n, errdefs.ErrInvalidArgument)
		}
	}
	return &libcontainer.CriuOpts{
		ImagesDirectory:         o.ImagePath,
		WorkDirectory:           o.WorkPath,
		LeaveRunning:            !o.Exit,
		TcpEstablished:          o.OpenTCP,
		ExternalUnixConnections: o.ExternalUnixSockets,
		ShellJob:                o.Terminal,
		FileLocks:               o.FileLocks,
		EmptyNs:                 ns,
		ManageCgroupsMode:       o.CgroupsMode,
		StatusFd:                -1,
	}, nil
}

// Checkpoint dumps the container with CRIU into o.ImagePath. Without LeaveRunning CRIU kills
// the container's processes after the dump (init exits with SIGKILL). PrepareDump comes first
// (it also waits for init to exec the user's program).
func (c *Container) Checkpoint(o CheckpointOpts) error {
	if err := criuReady(); err != nil {
		return err
	}
	opts, err := o.criu()
	if err != nil {
		return err
	}
	paused := c.Paused()
	shimFreezes, criuFreezes := freezeFor(paused, o, CRIULeavesFrozen())
	froze := criuFreezes || shimFreezes && c.Pause() == nil
	err = wrap("checkpoint", c.dump(opts))
	if err == nil {
		fault.Point(fault.ShimAfterDump)
	}
	if paused && err != nil && !c.Paused() {
		// CRIU thaws a cgroup it found frozen once it holds the tasks by ptrace, and freezes it
		// again when done; killed in between, it leaves the client's paused task running while
		// the client believes it paused, and its Resume then fails (issue 16 item 7).
		if perr := c.Pause(); perr != nil {
			log.L.WithError(perr).Warn("freeze the paused task again after a failed dump")
		}
	}
	if thawAfter(froze, o, err) {
		if rerr := c.Resume(); rerr != nil && err == nil && !o.Exit {
			err = rerr
		}
	}
	return err
}

// freezeFor decides who freezes the task's cgroup for the dump o, if the client has not
// (paused): the shim first, or CRIU at its seize (leavesFrozen: CRIU has LeaveFrozen). The
// task is frozen from the first step that freezes it to the thaw, so the later the freeze the
// shorter the task's downtime. A CRIU with LeaveFrozen (contrib/criu/0008) freezes the cgroup when it
// seizes the tasks, after its own start and libcontainer's preparation (mountinfo, masks,
// descriptors.json, the wrapper's and CRIU's execs, the kerndat cache: 15-20 ms here, more
// under load), and leaves it frozen after a successful leave-running dump: Checkpoint then only
// thaws it (unless KeepFrozen). Without it, the shim freezes first, as CRIU leaves frozen only a
// cgroup it found frozen, and a stock CRIU's freeze of a cgroup v1 waited ~100 ms for its first
// poll (fixed by contrib/criu/0007). A dump with Exit is frozen first either way: CRIU ignores
// LeaveFrozen then, and the processes die frozen.
//
// Both freezes give up after about 10 s: the shim's Pause retries libcontainer's (~1000
// attempts, about a second on a loaded host, then "unable to freeze") until freezeTimeout,
// CRIU's --freeze-cgroup polls (with the same thaw-and-refreeze kludges) until its --timeout,
// 10 s by default, which bounds the whole seize. A shim whose Pause fails leaves the freeze to
// CRIU, which then thaws the cgroup after the dump: the caller's check (the capture's) sees it.
func freezeFor(paused bool, o CheckpointOpts, leavesFrozen bool) (shim, criu bool) {
	if paused {
		return false, false
	}
	criu = !o.Exit && leavesFrozen
	return !criu, criu
}

// thawAfter tells whether Checkpoint thaws the cgroup after the dump that froze it (froze: the
// shim's freeze or CRIU's, not the client's): unless the caller keeps it frozen after a
// leave-running dump that succeeded. After an exit the processes are gone or going: thawing
// lets a killed one finish. A CRIU killed between its freeze and its seize leaves the cgroup
// frozen: a failed dump thaws whatever CRIU left.
func thawAfter(froze bool, o CheckpointOpts, dumpErr error) bool {
	return froze && (dumpErr != nil || o.Exit || !o.KeepFrozen)
}

// Restore restores the container from o.ImagePath as p (the new init, whose stdio replaces the
// checkpointed pipes). The container's rootfs must already be mounted. The restore ends, failed,
// when ctx ends or it passes lim (restoreWatchdog).
func (c *Container) Restore(ctx context.Context, p *libcontainer.Process, o CheckpointOpts, lim RestoreLimits) error {
	if err := criuReady(); err != nil {
		return err
	}
	opts, err := o.criu()
	if err != nil {
		return err
	}
	opts.LeaveRunning = false
	p.Init = true
	// Pages in parent image directories (pkg/pagechain): nothing of the chain is rewritten while
	// CRIU reads it, through a materialised copy where pages are stored compressed.
	chain, err := pagechain.OpenRestore(o.ImagePath)
	if err != nil {
		return err
	}
	defer chain.Close()
	opts.ImagesDirectory = chain.Dir
	// Until the restored init is held, no exec may join anything: the old init is gone.
	c.guard.drop()
	w := c.watchRestore(ctx, opts.WorkDirectory, lim)
	err = c.lc.Restore(p, opts)
	learnCRIUVersion(c.lc)
	if cause := w.stop(); cause != nil {
		// Whatever CRIU restored before it was killed (a restorer looping on a short page file
		// outlives CRIU) or by the time it finished goes too.
		_ = c.Signal(unix.SIGKILL, true)
		if err == nil {
			return cause
		}
		return fmt.Errorf("%w (CRIU: %v)", cause, err)
	}
	if err != nil {
		return wrap("restore", err)
	}
	// libcontainer records the restored init's start time in its state file but not in the
	// Container it restored through (runc reloads per command), which then believes init is
	// gone and refuses signals. Reload it from the state, like the next runc command would.
	lc, err := libcontainer.Load(c.root, c.lc.ID())
	if err != nil {
		return wrap("reload restored container", err)
	}
	giveCRIUVersion(lc)
	c.lc = lc
	return c.guard.hold(c.InitPid())
}

// initComm is the name libcontainer's init goes by until it execs the user's program.
const initComm = "runc:[2:INIT]"

// execWaitLimit bounds waitUserExec: the wait is on the scheduler, which on 2 cores busy with 16
// dumps may leave an init unscheduled for a while.
const execWaitLimit = 10 * time.Second

// waitUserExec waits, up to limit, for init to exec the user's program. A task Start returns
// once libcontainer's init may exec, not once it has: a task frozen right after its start (by
// Pause, or by CRIU's seize) could be frozen still running the shim binary, mapped from outside
// the container's mounts, which CRIU cannot dump ("Can't lookup mount ...
// path=/containerd-shim-cklite-v2"). The poll starts at 100µs (an init that is running execs
// within that) and backs off to 10ms. Once seen past its exec, init is not looked at again.
func (c *Container) waitUserExec(limit time.Duration) {
	if c.execd.Load() {
		return
	}
	comm := fmt.Sprintf("/proc/%d/comm", c.InitPid())
	step := 100 * time.Microsecond
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(step) {
		b, err := os.ReadFile(comm)
		if err != nil {
			return
		}
		if strings.TrimSpace(string(b)) != initComm {
			c.execd.Store(true)
			return
		}
		step = min(2*step, 10*time.Millisecond)
	}
	log.L.WithField("pid", c.InitPid()).Warnf("init has not exec'd its program %s after its start: going on (a dump would fail on the shim's binary)", limit)
}

// criu is what PrepareCRIU found, once per process.
var criu struct {
	once     sync.Once
	prepared bool
	err      error
	// leavesFrozen is the answer of CRIU's feature check for LeaveFrozen (leaveFrozenProbe).
	leavesFrozen func() bool
}

// PrepareCRIU looks CRIU up and gives it its kerndat cache, once per process: the shim calls it
// at start, so that building options or running a checkpoint never touches the host. A missing
// CRIU is the returned error, and every later Checkpoint and Restore fails with it; the shim
// runs on without, for containers that are never checkpointed. It also starts asking CRIU
// whether it has LeaveFrozen (leaveFrozenProbe) and calls probed once that CRIU run has been
// waited for, or at once when there is none: a shim holds its reaper of orphans until then, as
// for every CRIU run, lest it reap the check's exit from under exec's wait.
func PrepareCRIU(probed func()) error {
	started := false
	criu.once.Do(func() {
		criu.prepared = true
		if criu.err = lookCRIU(); criu.err != nil {
			return
		}
		if err := keepKerndatCache(); err != nil {
			log.L.WithError(err).Warn("CRIU will probe the kernel on every run")
		}
		if err := keepPagesCache(); err != nil {
			log.L.WithError(err).Warn("restores of compressed page images will copy them to the disk")
		}
		criu.leavesFrozen = leaveFrozenProbe(func(feature string) bool {
			defer probed()
			return criuHasFeature(feature)
		})
		started = true
	})
	if !started {
		probed()
	}
	return criu.err
}

// CRIULeavesFrozen reports whether the CRIU that PrepareCRIU found has LeaveFrozen; without
// PrepareCRIU, or without CRIU, it has not.
func CRIULeavesFrozen() bool {
	return criu.leavesFrozen != nil && criu.leavesFrozen()
}

// leaveFrozenProbe asks has, in the background, whether CRIU has the leave_frozen feature, and
// returns the answer's getter, which waits for it. Once per shim: an option CRIU does not know
// fails the dump that reads it from its configuration file, so it is given only to a CRIU that
// said it has it, and asking on every checkpoint would put a CRIU run (an exec and its kerndat:
// ~5 ms, more under load) into each. The CRIU a shim runs does not change under it, as for its
// version (criuversion.go): a criu installed meanwhile is asked by the next shim. In the
// background because a shim's start (every container's create waits for it) need not wait for
// an answer only a dump needs, long after; its version string cannot tell, the host's own criu
// 4.2.1, linked by contrib/install.sh, is as new as the patched one.
func leaveFrozenProbe(has func(feature string) bool) func() bool {
	answer := make(chan bool, 1)
	go func() { answer <- has(leaveFrozenFeature) }()
	return sync.OnceValue(func() bool { return <-answer })
}

// criuHasFeature runs `criu check --feature`: 0 if CRIU has feature, an error for one it does
// not know or cannot use here.
func criuHasFeature(feature string) bool {
	return exec.Command("criu", "check", "--feature", feature).Run() == nil
}

// criuReady is PrepareCRIU's verdict; a process that never called it has no CRIU to run.
func criuReady() error {
	if !criu.prepared {
		return fmt.Errorf("CRIU was not prepared (runtime.PrepareCRIU is called at shim start): %w", errdefs.ErrFailedPrecondition)
	}
	return criu.err
}

// lookCRIU checks that libcontainer will find criu, which it runs from PATH: without it
// libcontainer fails with a bare exec error that does not say what to install.
func lookCRIU() error {
	if _, err := exec.LookPath("criu"); err != nil {
		return fmt.Errorf("CRIU is not installed where the shim looks (PATH %q): install CRIU >= 4 ('make deps' builds one into /opt/cklite/bin): %w: %w",
			os.Getenv("PATH"), err, errdefs.ErrFailedPrecondition)
	}
	return nil
}
