package shim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/runtime"
	"github.com/cklite/cklite/snapshotter/freeze"
)

// ckliteVersion is written into every checkpoint's metadata.
const ckliteVersion = "cklite/1"

// Checkpoint the container: a CRIU dump and, in the same frozen instant, its rootfs upper frozen
// into an immutable layer (both or neither). Leaving the task running (what every client gets
// unless it asks to exit) is dump, freeze, restore in place: the processes come back on a fresh
// upper stacked on the frozen layer, paused again if they were.
func (s *service) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*ptypes.Empty, error) {
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	if err := c.init.expect("checkpoint", statusRunning, statusPaused); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	o, err := decodeCheckpointOptions(r.Options)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	ctx = namespaces.WithNamespace(ctx, ns)
	if o.ImagePath != "" {
		if err := checkImageDir(o.ImagePath); err != nil {
			return nil, errgrpc.ToGRPC(err)
		}
	}
	ck := &checkpointRun{s: s, c: c, opts: o, path: o.ImagePath}
	if ck.path == "" {
		ck.path = r.Path
	}
	// CRIU's logs and stats go to a work directory, kept out of the image like runc-v2 does
	// (a temporary one unless the client names it).
	ck.work = o.WorkPath
	if ck.work == "" {
		ck.work = filepath.Join(c.bundle, "criu-work")
		defer os.RemoveAll(ck.work)
	}
	c.checkpointMu.Lock()
	defer c.checkpointMu.Unlock()
	release := s.reaper.hold() // CRIU is libcontainer's child
	defer release()
	if err := ck.run(ctx, ns); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	s.events.send(&eventstypes.TaskCheckpointed{ContainerID: c.id, Checkpoint: ck.path})
	return empty, nil
}

// checkpointRun is one checkpoint of one container.
type checkpointRun struct {
	s          *service
	c          *container
	opts       *options.CheckpointOptions
	path, work string
	lm         leases.Manager
	dump       checkpoint.DumpFlags // how the dump a restore in place restores was taken
}

func (ck *checkpointRun) criuOpts(exit bool) runtime.CheckpointOpts {
	o := ck.opts
	return runtime.CheckpointOpts{
		ImagePath:           ck.path,
		WorkPath:            ck.work,
		Exit:                exit,
		OpenTCP:             o.OpenTcp,
		ExternalUnixSockets: o.ExternalUnixSockets,
		Terminal:            o.Terminal,
		FileLocks:           o.FileLocks,
		EmptyNamespaces:     o.EmptyNamespaces,
		CgroupsMode:         o.CgroupsMode,
	}
}

func (ck *checkpointRun) run(ctx context.Context, ns string) error {
	c := ck.c
	rs, err := ck.s.daemon.containerRootfs(ctx, ns, c.id)
	if err != nil {
		return err
	}
	contents, err := checkpoint.RequestedContents(c.spec.Annotations, rs.labels)
	if err != nil {
		return err
	}
	if ck.lm, err = ck.s.daemon.leases(); err != nil {
		return err
	}
	// Everything the checkpoint creates in containerd is held by this lease until the
	// checkpoint's own lease holds it: containerd's collector never sees the frozen layer
	// unreferenced in between.
	work, err := ck.lm.Create(ctx, leases.WithRandomID(), leases.WithExpiration(10*time.Minute))
	if err != nil {
		return fmt.Errorf("lease for the checkpoint: %w", err)
	}
	defer ck.lm.Delete(context.WithoutCancel(ctx), work) //nolint:errcheck
	ctx = leases.WithLease(ctx, work.ID)
	meta := checkpoint.Meta{
		ID:        checkpoint.NewID(),
		Namespace: ns,
		Container: c.id,
		Contents:  contents,
		Host:      checkpoint.MachineID(),
		Created:   time.Now().UTC(),
		Version:   ckliteVersion,
		Lineage:   rs.labels[checkpoint.LineageKey],
		Dump: checkpoint.DumpFlags{
			OpenTCP:             ck.opts.OpenTcp,
			ExternalUnixSockets: ck.opts.ExternalUnixSockets,
			Terminal:            ck.opts.Terminal,
			FileLocks:           ck.opts.FileLocks,
		},
	}
	if meta.Name, err = checkpoint.RequestedName(rs.labels); err != nil {
		return err
	}
	if meta.Labels, err = checkpoint.RequestedLabels(rs.labels); err != nil {
		return err
	}
	ttl, err := checkpointTTL(ck.s.config, c.spec.Annotations, rs.labels)
	if err != nil {
		return err
	}
	if ttl > 0 {
		meta.Expires = meta.Created.Add(ttl)
	}
	if contents.HasFS() && (rs.key == "" || c.rootfs == "") {
		return fmt.Errorf("container %s has no rootfs snapshot to freeze (its rootfs comes from the spec): ask for a memory-only checkpoint (label %s=%s): %w",
			c.id, checkpoint.ContentsKey, checkpoint.MemoryOnly, errdefs.ErrFailedPrecondition)
	}
	if contents.HasMemory() {
		if err := c.noRunningExecs(); err != nil {
			return err
		}
		meta.Dump.ExternalNetNS = c.engine.HasNetNS()
		if meta.Dump.NetworkLock, err = networkLock(c.init.getPid(), meta.Dump.ExternalNetNS); err != nil {
			return err
		}
		if err := c.engine.PrepareDump(ck.work, dumpCRIUOptions(meta.Dump)...); err != nil {
			return err
		}
	}
	if contents == checkpoint.MemoryOnly {
		if err := c.engine.Checkpoint(ck.criuOpts(ck.opts.Exit)); err != nil {
			return keepDumpLog(c.bundle, ck.work, err)
		}
		return ck.record(ctx, meta)
	}
	sn, err := ck.s.daemon.snapshotter(rs.snapshotter)
	if err != nil {
		return err
	}
	meta.Snapshotter = rs.snapshotter
	meta.Frozen = checkpoint.FrozenName(meta.ID)
	if meta.Parent, err = parentCheckpoint(ctx, sn, rs.key); err != nil {
		return err
	}
	if contents == checkpoint.FSOnly {
		return ck.filesystemOnly(ctx, sn, rs.key, meta)
	}
	return ck.withRootfs(ctx, sn, rs.key, meta)
}

// filesystemOnly freezes a copy of the rootfs upper without CRIU: the task is frozen in its
// cgroup for the copy (unless the client paused it already) and runs on, on its own upper,
// afterwards; with Exit it is killed once the copy is recorded.
func (ck *checkpointRun) filesystemOnly(ctx context.Context, sn snapshots.Snapshotter, key string, meta checkpoint.Meta) error {
	c := ck.c
	pause := !c.engine.Paused()
	if pause {
		if err := c.engine.Pause(); err != nil {
			return err
		}
	}
	start := time.Now()
	err := ck.copyRootfs(ctx, sn, key, meta)
	copied := time.Since(start)
	if pause {
		if rerr := c.engine.Resume(); rerr != nil && err == nil {
			err = fmt.Errorf("resume the task after its filesystem-only checkpoint: %w", rerr)
		}
	}
	if err != nil {
		return err
	}
	log.G(ctx).WithFields(log.Fields{"id": meta.ID, "copy": copied}).Info("filesystem-only checkpoint")
	if ck.opts.Exit {
		return c.engine.Signal(unix.SIGKILL, true)
	}
	return nil
}

// copyRootfs freezes a copy of key's upper as the checkpoint's layer and records it; a copy that
// cannot be recorded is removed again.
func (ck *checkpointRun) copyRootfs(ctx context.Context, sn snapshots.Snapshotter, key string, meta checkpoint.Meta) error {
	if err := freeze.Copy(ctx, sn, nil, key, meta.Frozen, map[string]string{checkpoint.LabelID: meta.ID}); err != nil {
		return err
	}
	if err := ck.record(ctx, meta); err != nil {
		if rerr := sn.Remove(context.WithoutCancel(ctx), meta.Frozen); rerr != nil {
			log.G(ctx).WithError(rerr).WithField("frozen", meta.Frozen).Warn("remove the unrecorded copy")
		}
		return err
	}
	return nil
}

// withRootfs dumps the processes (CRIU kills them), freezes the unmounted rootfs, records the
// checkpoint, then restores the processes on the new upper unless the client asked to exit.
// Whatever fails, the container ends up running on an intact filesystem, or, if even the restore
// of the dump fails, stopped with an exit containerd sees; no half checkpoint is recorded.
func (ck *checkpointRun) withRootfs(ctx context.Context, sn snapshots.Snapshotter, key string, meta checkpoint.Meta) error {
	c := ck.c
	held, err := holdTask(c, meta.Dump.ExternalNetNS)
	if err != nil {
		return err
	}
	defer held.Close()
	ck.dump = meta.Dump
	paused := c.engine.Paused()
	pid := c.init.getPid()
	exited := c.init.beginHandover()
	start := time.Now()
	if err := c.engine.Checkpoint(ck.criuOpts(true)); err != nil {
		// CRIU resumes the tasks when a dump fails: nothing changed.
		if code, gone := c.init.endHandover(); gone {
			ck.s.initExited(c, c.init, pid, code)
		}
		return keepDumpLog(c.bundle, ck.work, err)
	}
	code := ck.dumpedExit(ctx, exited)
	dumped := time.Since(start)

	// The processes are gone: the upper can be unmounted and frozen.
	err = c.engine.Destroy()
	if err == nil {
		err = c.unmountRootfs(ctx)
	}
	if err == nil {
		err = freeze.Freeze(ctx, sn, nil, key, meta.Frozen, map[string]string{checkpoint.LabelID: meta.ID})
	}
	frozen := err == nil
	if frozen {
		err = ck.record(ctx, meta)
		if err != nil {
			// Unfreezing is not possible; the layer stays in the chain, unrecorded, and the
			// collector frees it with the container.
			log.G(ctx).WithError(err).WithField("frozen", meta.Frozen).Warn("checkpoint not recorded")
		}
	}
	froze := time.Since(start) - dumped
	if ck.opts.Exit && err == nil {
		c.init.endHandover()
		if merr := ck.remount(ctx, sn, key); merr != nil {
			log.G(ctx).WithError(merr).Warn("remount rootfs of the exited task")
		}
		ck.s.initExited(c, c.init, pid, code)
		return nil
	}
	if rerr := ck.restoreInPlace(ctx, sn, key, held, paused); rerr != nil {
		c.init.endHandover()
		ck.s.initExited(c, c.init, pid, code)
		if err != nil {
			return fmt.Errorf("checkpoint failed (%w) and the task could not be restored from its dump in %s: %w", err, ck.path, rerr)
		}
		return fmt.Errorf("checkpoint %s was written to %s, but the task could not be restored afterwards: %w", meta.ID, ck.path, rerr)
	}
	c.init.endHandover()
	log.G(ctx).WithFields(log.Fields{
		"id": meta.ID, "dump": dumped, "freeze": froze, "restore": time.Since(start) - dumped - froze,
	}).Info("checkpoint: task restored in place")
	if err != nil {
		return fmt.Errorf("checkpoint failed, the task runs on: %w", err)
	}
	return nil
}

// record writes the metadata into the image directory and creates the checkpoint's lease.
func (ck *checkpointRun) record(ctx context.Context, meta checkpoint.Meta) error {
	// Without CRIU (a filesystem-only checkpoint) nothing has made the directory yet.
	if err := os.MkdirAll(ck.path, 0o700); err != nil {
		return fmt.Errorf("checkpoint image directory: %w", err)
	}
	var err error
	if meta.MemoryBytes, err = checkpoint.ImageSize(ck.path); err != nil {
		return fmt.Errorf("size of checkpoint images: %w", err)
	}
	if err := checkpoint.Write(ck.path, meta); err != nil {
		return err
	}
	// Only a directory the client named outlives the call; the daemon's temporary one does not.
	rec := checkpoint.Record{Meta: meta, ImagePath: ck.opts.ImagePath}
	if _, err := checkpoint.Hold(ctx, ck.lm, rec); err != nil {
		os.Remove(filepath.Join(ck.path, checkpoint.MetaFile))
		return err
	}
	ck.s.descend(ctx, ck.c.id, meta)
	return nil
}

// descend records that container id's state now descends from checkpoint meta (taken of it,
// restored or rolled back to). A failure is logged, not returned: the checkpoint or restore is
// done, and a lineage left behind only refuses rollbacks that --force-foreign still allows.
func (s *service) descend(ctx context.Context, id string, meta checkpoint.Meta) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err == nil {
		err = s.daemon.setLineage(ctx, ns, id, checkpoint.Descend(meta.ID, checkpoint.ParseLineage(meta.Lineage)))
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("checkpoint", meta.ID).Warn("lineage not recorded")
	}
}

// remount mounts the container's snapshot key again at <bundle>/rootfs.
func (ck *checkpointRun) remount(ctx context.Context, sn snapshots.Snapshotter, key string) error {
	mounts, err := sn.Mounts(ctx, key)
	if err != nil {
		return fmt.Errorf("mounts of %s: %w", key, err)
	}
	return ck.c.mountRootfs(mounts)
}

// taskHold is what a restore in place gives back to a task whose processes are gone: its stdio
// and, when the dump left it out, its network namespace, held open meanwhile so that neither goes
// away with the processes.
type taskHold struct {
	stdio *heldStdio
	netns *os.File
}

func holdTask(c *container, netns bool) (*taskHold, error) {
	stdio, err := holdStdio(c.init, c.engine)
	if err != nil {
		return nil, err
	}
	h := &taskHold{stdio: stdio}
	if netns {
		if h.netns, err = runtime.OpenNetNS(c.init.getPid()); err != nil {
			stdio.Close()
			return nil, err
		}
	}
	return h, nil
}

func (h *taskHold) Close() {
	h.stdio.Close()
	if h.netns != nil {
		h.netns.Close()
	}
}

// restoreInPlace brings the dumped processes back in the same container, on key's current
// layers, with the stdio and network namespace held for them.
func (ck *checkpointRun) restoreInPlace(ctx context.Context, sn snapshots.Snapshotter, key string, hold *taskHold, paused bool) error {
	held, netns := hold.stdio, hold.netns
	c := ck.c
	if err := ck.remount(ctx, sn, key); err != nil {
		return err
	}
	engine, err := c.createEngine(func(cfg *configs.Config) error {
		// The container's hooks ran when it was created; run again, a CNI hook would add a
		// second interface to the namespace that still has the first.
		cfg.Hooks = nil
		if named, _ := runtime.SpecNetNS(cfg); netns != nil && !named {
			runtime.WithNetNS(cfg, netns)
		}
		opts := dumpCRIUOptions(ck.dump)
		if paused {
			// The client paused the task around the checkpoint and will resume it: it must
			// not run between CRIU's restore and the freeze.
			opts = append(opts, runtime.LeaveStopped)
		}
		if len(opts) == 0 {
			return nil
		}
		return runtime.WithCRIUOptions(cfg, ck.work, opts...)
	})
	if err != nil {
		return err
	}
	lp, err := runtime.NewProcess(c.init.spec)
	if err != nil {
		return err
	}
	if err := held.attach(lp); err != nil {
		_ = engine.Destroy()
		return err
	}
	rctx, limits, end, err := c.beginRestore(ctx)
	if err != nil {
		_ = engine.Destroy()
		return err
	}
	err = engine.Restore(rctx, lp, ck.criuOpts(false), limits)
	end()
	if err != nil {
		_ = engine.Destroy()
		return keepRestoreLog(c.bundle, ck.work, err)
	}
	pid, err := lp.Pid()
	if err != nil {
		return err
	}
	if err := held.restored(ctx); err != nil {
		// Nobody would see its terminal: the task ends stopped, as if the restore had failed.
		_ = lp.Signal(os.Kill)
		_, _ = lp.Wait()
		_ = engine.Destroy()
		return err
	}
	ck.s.reaper.own(pid)
	c.mu.Lock()
	c.engine = engine
	c.mu.Unlock()
	c.init.started(lp, pid, statusRunning)
	ck.s.watchInit(ctx, c)
	if paused {
		if err := engine.PauseStopped(); err != nil {
			return err
		}
		c.init.setState(statusPaused)
	}
	return nil
}

// parentCheckpoint is the checkpoint whose frozen layer key is stacked on, or "".
func parentCheckpoint(ctx context.Context, sn snapshots.Snapshotter, key string) (string, error) {
	info, err := sn.Stat(ctx, key)
	if err != nil {
		return "", fmt.Errorf("rootfs snapshot %s: %w", key, err)
	}
	if info.Parent == "" {
		return "", nil
	}
	parent, err := sn.Stat(ctx, info.Parent)
	if err != nil {
		return "", fmt.Errorf("parent %s of rootfs snapshot %s: %w", info.Parent, key, err)
	}
	return parent.Labels[checkpoint.LabelID], nil
}

// rootfsForRestore replaces container id's rootfs snapshot by a fresh one on the frozen layer of
// checkpoint meta, and returns its mounts: what the container wrote since is discarded.
func (s *service) rootfsForRestore(ctx context.Context, ns, id string, meta checkpoint.Meta) ([]mount.Mount, error) {
	ctx = namespaces.WithNamespace(ctx, ns)
	rs, err := s.daemon.containerRootfs(ctx, ns, id)
	if err != nil {
		return nil, err
	}
	if rs.key == "" {
		return nil, fmt.Errorf("checkpoint %s holds a filesystem, but container %s has no rootfs snapshot to restore it into: %w", meta.ID, id, errdefs.ErrFailedPrecondition)
	}
	if rs.snapshotter != meta.Snapshotter {
		return nil, fmt.Errorf("checkpoint %s's filesystem is in snapshotter %q, container %s uses %q: %w", meta.ID, meta.Snapshotter, id, rs.snapshotter, errdefs.ErrFailedPrecondition)
	}
	sn, err := s.daemon.snapshotter(rs.snapshotter)
	if err != nil {
		return nil, err
	}
	if err := s.frozenLayerExists(ctx, sn, meta); err != nil {
		return nil, err
	}
	info, err := sn.Stat(ctx, rs.key)
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("rootfs snapshot %s: %w", rs.key, err)
	}
	if err == nil {
		if err := sn.Remove(ctx, rs.key); err != nil {
			return nil, fmt.Errorf("replace rootfs snapshot %s: %w", rs.key, err)
		}
	}
	mounts, err := sn.Prepare(ctx, rs.key, meta.Frozen, snapshots.WithLabels(info.Labels))
	if err != nil {
		return nil, fmt.Errorf("stack rootfs snapshot %s on frozen layer %s of checkpoint %s: %w", rs.key, meta.Frozen, meta.ID, err)
	}
	return mounts, nil
}

// noRunningExecs refuses a dump while processes started with exec run: their parent is the shim,
// outside the init's process tree that CRIU dumps, so the dump would leave them out and (with
// the init's PID namespace gone) kill them.
func (c *container) noRunningExecs() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runningExecs == 0 {
		return nil
	}
	var ids []string
	for id, p := range c.execs {
		if p.status() == statusRunning {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return fmt.Errorf("container %s has %d process(es) started with exec still running (%s): CRIU dumps only the init's process tree, which they are not part of; wait for them or kill them first: %w",
		c.id, c.runningExecs, strings.Join(ids, ", "), errdefs.ErrFailedPrecondition)
}

// checkpointTTL is how long a checkpoint lives: what its container asks for, else the shim
// configuration's default; 0 is forever.
func checkpointTTL(sc shimConfig, annotations, labels map[string]string) (time.Duration, error) {
	if ttl, ok, err := checkpoint.RequestedTTL(annotations, labels); err != nil || ok {
		return ttl, err
	}
	cfg, err := sc.get()
	if err != nil {
		return 0, err
	}
	return cfg.DefaultTTL()
}

// frozenLayerExists checks that checkpoint meta's frozen layer is in sn, naming why not.
func (s *service) frozenLayerExists(ctx context.Context, sn snapshots.Snapshotter, meta checkpoint.Meta) error {
	_, err := sn.Stat(ctx, meta.Frozen)
	switch {
	case err == nil:
		return nil
	case !errdefs.IsNotFound(err):
		return fmt.Errorf("frozen layer %s of checkpoint %s: %w", meta.Frozen, meta.ID, err)
	case meta.Host != checkpoint.MachineID():
		return fmt.Errorf("checkpoint %s was taken on another host (machine id %s): its frozen layer %s exists only there: %w", meta.ID, meta.Host, meta.Frozen, errdefs.ErrNotFound)
	}
	return fmt.Errorf("frozen layer %s of checkpoint %s no longer exists (checkpoint removed?): %w", meta.Frozen, meta.ID, errdefs.ErrNotFound)
}

// dumpedExit waits for the exit of the init CRIU has just dumped and ends. Should CRIU leave the
// processes alive instead (a CRIU configuration that says leave-stopped or leave-running), the
// checkpoint must not wait forever: they are killed, as the dump would have.
func (ck *checkpointRun) dumpedExit(ctx context.Context, exited <-chan int) int {
	select {
	case code := <-exited:
		return code
	case <-time.After(5 * time.Second):
	}
	log.G(ctx).Warn("the dumped processes are still alive after the dump: killing them (a CRIU configuration with leave-stopped or leave-running?)")
	if err := ck.c.engine.Signal(unix.SIGKILL, true); err != nil {
		log.G(ctx).WithError(err).Error("kill the dumped processes")
	}
	return <-exited
}

// networkLock chooses how CRIU locks the network of a container with a namespace of its own
// (init pid's) for a dump: not at all without TCP sockets, with nftables when CRIU can, else with
// CRIU's default, iptables.
func networkLock(pid int, ownNetNS bool) (string, error) {
	if !ownNetNS {
		return "", nil // the host's network: CRIU locks the container's connections its own way
	}
	tcp, err := runtime.HasTCPSockets(pid)
	switch {
	case err != nil:
		return "", err
	case !tcp:
		return "skip", nil
	case runtime.NftablesLockSupported():
		return "nftables", nil
	}
	return "", nil
}

// dumpCRIUOptions are the options of cklite's CRIU configuration for a dump taken with flags,
// and for its restore.
func dumpCRIUOptions(flags checkpoint.DumpFlags) []string {
	switch flags.NetworkLock {
	case "skip":
		return []string{runtime.NetworkLockSkip}
	case "nftables":
		return []string{runtime.NetworkLockNftables}
	}
	return nil
}
