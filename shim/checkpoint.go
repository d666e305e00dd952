package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/runtime"
	"github.com/cklite/cklite/snapshotter/freeze"
)

// ckliteVersion is written into every checkpoint's metadata.
const ckliteVersion = "cklite/1"

// Checkpoint the container: a CRIU dump and, in the same frozen instant, its rootfs upper captured
// into an immutable layer (both or neither). Leaving the task running (what every client gets
// unless it asks to exit) never stops it (capture.go); past the switch rule, it is dump, freeze,
// restore in place (inplace.go). With Exit the dump kills it; its upper is captured after a
// previous capture, frozen as it is otherwise.
func (s *service) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*ptypes.Empty, error) {
	t := newSteps()
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
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
	ck := &checkpointRun{s: s, c: c, opts: o, path: o.ImagePath, t: t}
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
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	t.mark("request")
	from, err := c.init.transition("checkpoint", statusCheckpointing)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	// A dump that failed, or one that leaves the processes as they were, ends where it began.
	defer c.init.settle(statusCheckpointing, from)
	release := s.reaper.hold() // CRIU is libcontainer's child
	defer release()
	if err := ck.run(ctx, ns); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	s.dedupPages(ctx, ns, ck)
	s.events.send(&eventstypes.TaskCheckpointed{ContainerID: c.id, Checkpoint: ck.path})
	t.mark("after")
	t.fields["total"] = time.Since(t.start)
	log.G(ctx).WithFields(t.fields).WithField("id", c.id).Info("checkpoint steps")
	if !o.Exit {
		// In the background, beside the answer (runtime/criuready.go).
		c.engine().PrepareNextDump()
	}
	return empty, nil
}

// checkpointRun is one checkpoint of one container.
type checkpointRun struct {
	s          *service
	c          *container
	opts       *options.CheckpointOptions
	path, work string
	lm         leases.Manager
	lease      *workLease
	dumped     bool   // dump has written the image directory
	t          *steps // the time each step took, logged once the checkpoint is answered
	// descended is closed once the container's lineage names the checkpoint (descend, started
	// by startDescend), lineage is the one it had before; listed says the checkpoint's lease
	// was created.
	descended chan struct{}
	lineage   string
	listed    bool
}

func (ck *checkpointRun) run(ctx context.Context, ns string) (err error) {
	c := ck.c
	if ck.lm, err = ck.s.daemon.leases(); err != nil {
		return err
	}
	ck.lease = startWorkLease(ctx, ck.lm)
	defer func() { ck.lease.end(ctx, err == nil) }()
	defer ck.undescend(ctx)
	// The container's record is read from containerd beside the preparation of the dump, which
	// does not need it, when the spec alone asks for memory: the record's labels can say
	// otherwise (rarely), and a preparation they make useless is undone (the stdio record; the
	// engine's dump configuration stays, for the next dump).
	record := ck.readRecord(ctx, ns)
	var dump *dumpPrep
	if want, err := checkpoint.RequestedContents(c.spec.Annotations, nil); err == nil && want.HasMemory() {
		dump = ck.prepareDump()
	}
	defer func() {
		if err != nil && dump != nil && !ck.dumped {
			// A checkpoint refused before its dump (a label, no rootfs snapshot) leaves the
			// client's image directory as it found it, so that the same one can be tried again.
			removeExecStdio(ck.path)
		}
	}()
	rs, err := record()
	if err != nil {
		return err
	}
	contents, err := checkpoint.RequestedContents(c.spec.Annotations, rs.labels)
	if err != nil {
		return err
	}
	ck.t.mark("container")
	meta := checkpoint.Meta{
		ID:        checkpoint.NewID(),
		Namespace: ns,
		Container: c.id,
		Contents:  contents,
		Host:      checkpoint.MachineID(),
		Created:   time.Now().UTC(),
		Version:   ckliteVersion,
		Lineage:   rs.labels[checkpoint.LineageKey],
		Dump:      dumpFlags(ck.opts),
		Init:      c.withInit,
		InitBuild: c.initBuild,
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
	ck.t.mark("meta")
	switch {
	case contents.HasMemory():
		if dump == nil {
			dump = ck.prepareDump()
		}
		if dump.err != nil {
			return dump.err
		}
		meta.Dump = dump.flags
	case dump != nil:
		removeExecStdio(ck.path)
	}
	if contents == checkpoint.MemoryOnly {
		if err := c.engine().Checkpoint(ck.criuOpts(ck.opts.Exit)); err != nil {
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
	switch {
	case contents == checkpoint.FSOnly:
		return ck.filesystemOnly(ctx, sn, rs.key, meta)
	case ck.opts.Exit && c.captured == nil:
		// The task ends: the upper, whatever its size, is frozen as it is in O(1), on the layer
		// it is stacked on.
		return ck.withRootfs(ctx, sn, rs.key, meta)
	}
	// With Exit after a capture, what changed since that capture: the chain stays one delta per
	// checkpoint. The switch rule cannot apply then (the task is gone after the dump).
	err = ck.captureRootfs(ctx, sn, rs.key, meta, ck.dump, !ck.opts.Exit)
	if !errors.Is(err, errSwitch) {
		return err
	}
	// Decided from the estimate, before the dump, or (what the estimate did not see) after it:
	// then the in-place cycle dumps a second time.
	log.G(ctx).WithError(err).WithFields(log.Fields{"id": meta.ID, "dumpedTwice": ck.dumped}).Info("checkpoint: switching the upper instead of capturing it")
	if ck.dumped {
		if err := clearDump(ck.path); err != nil {
			return err
		}
	}
	return ck.withRootfs(ctx, sn, rs.key, meta)
}

// readRecord reads the container's record from containerd in the background; the function
// returned waits for it.
func (ck *checkpointRun) readRecord(ctx context.Context, ns string) func() (rootfsSnapshot, error) {
	return inBackground(func() (rootfsSnapshot, error) { return ck.s.daemon.containerRootfs(ctx, ns, ck.c.id) })
}

// dumpPrep is a prepared CRIU dump: its flags, or why it cannot be taken.
type dumpPrep struct {
	flags checkpoint.DumpFlags
	err   error
}

// prepareDump prepares CRIU's dump of the container: the stdio of its execs recorded into the
// image directory, the network lock chosen, the engine's dump configuration written.
func (ck *checkpointRun) prepareDump() *dumpPrep {
	c := ck.c
	d := &dumpPrep{flags: dumpFlags(ck.opts)}
	execOpts, err := c.captureExecs(ck.path)
	if err != nil {
		d.err = err
		return d
	}
	ck.t.mark("execs")
	d.flags.ExternalNetNS = c.engine().HasNetNS()
	if d.flags.NetworkLock, d.err = networkLock(c.init.getPid(), d.flags.ExternalNetNS); d.err != nil {
		return d
	}
	ck.t.mark("netlock")
	opts := append(dumpCRIUOptions(d.flags), execOpts...)
	// The dump's CRIU configuration goes to the same file of the bundle every time (not into the
	// work directory, which a client names anew for each checkpoint): the engine's configuration
	// then stays as it is.
	d.err = c.engine().PrepareDump(filepath.Join(c.bundle, "criu-dump"), opts...)
	ck.t.mark("prepareDump")
	return d
}

// removeExecStdio removes what prepareDump wrote into the image directory dir, for a checkpoint
// without memory; the dump's configuration stays, for the next dump.
func removeExecStdio(dir string) {
	if err := os.Remove(filepath.Join(dir, execStdioFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.L.WithError(err).Warn("remove the stdio record of a checkpoint without memory")
	}
}

// dump is CRIU's dump of the task, which leaves it frozen (KeepFrozen), or with Exit kills it.
func (ck *checkpointRun) dump() error {
	o := ck.criuOpts(ck.opts.Exit)
	o.KeepFrozen = true
	if err := ck.c.engine().Checkpoint(o); err != nil {
		return keepDumpLog(ck.c.bundle, ck.work, err)
	}
	ck.dumped = true
	return nil
}

// filesystemOnly captures the rootfs without CRIU while the task is frozen (captureRootfs);
// with Exit it is killed once the capture is recorded.
func (ck *checkpointRun) filesystemOnly(ctx context.Context, sn snapshots.Snapshotter, key string, meta checkpoint.Meta) error {
	if err := ck.captureRootfs(ctx, sn, key, meta, nil, false); err != nil {
		return err
	}
	if ck.opts.Exit {
		return ck.c.engine().Signal(unix.SIGKILL, true)
	}
	return nil
}

// withRootfs dumps the processes (CRIU kills them), freezes the unmounted rootfs, records the
// checkpoint, then restores the processes on the new upper unless the client asked to exit: the
// in-place cycle (inplace.go), for a checkpoint that exits or one past the switch rule
// (capture.go). Whatever fails, the container ends up running on an intact
// filesystem, or, if even the restore of the dump fails, stopped with an exit containerd sees;
// no half checkpoint is recorded.
func (ck *checkpointRun) withRootfs(ctx context.Context, sn snapshots.Snapshotter, key string, meta checkpoint.Meta) error {
	c := ck.c
	ctx, err := ck.lease.under(ctx)
	if err != nil {
		return err
	}
	// The upper becomes the layer, stacked where it is: its parent is the checkpoint of key's
	// parent, even when captures were taken since (they are its siblings).
	if meta.Parent, err = parentCheckpoint(ctx, sn, key); err != nil {
		return err
	}
	ip := &inPlace{
		s: ck.s, c: c, what: "checkpoint", sn: sn, key: key,
		dump:    meta.Dump,
		restore: ck.criuOpts(false),
		stop: func() error {
			if err := c.engine().Checkpoint(ck.criuOpts(true)); err != nil {
				return keepDumpLog(c.bundle, ck.work, err)
			}
			return nil
		},
		restoreAnyway: true,
		exit:          ck.opts.Exit,
		t:             ck.t, // the cycle's steps: "kill" is the dump that stops the task
	}
	ip.switchRootfs = func(ctx context.Context) error {
		on, err := ck.freezeRecorded(ctx, sn, meta)
		if on != "" {
			ip.key = on // the restore mounts the key the container's record names
		}
		return err
	}
	// Once CRIU's dump has ended the processes only the freeze and the restore bring them back:
	// they must not end with the request, which ttrpc cancels when containerd goes away (as a
	// rollback's, rollback.go). The freeze waits for containerd and the snapshotter, bounded.
	res, err := ip.run(context.WithoutCancel(ctx))
	switch {
	case err != nil:
		return err
	case res.stopped != nil && res.switched != nil:
		return fmt.Errorf("checkpoint failed (%w) and the task could not be restored from its dump in %s: %w", res.switched, ck.path, res.stopped)
	case res.stopped != nil:
		return fmt.Errorf("checkpoint %s was written to %s, but the task could not be restored afterwards: %w", meta.ID, ck.path, res.stopped)
	case res.switched != nil:
		return fmt.Errorf("checkpoint failed, the task runs on: %w", res.switched)
	}
	log.G(ctx).WithField("id", meta.ID).Info("checkpoint taken")
	return nil
}

// freezeRecorded freezes the container's upper as the checkpoint's layer and stacks its key on
// it again (freeze.Rootfs: the container's record names a snapshot that shows its files at every
// step, so a crash anywhere loses nothing), then records the checkpoint. It returns the key the
// record names. A checkpoint is recorded only once the whole freeze is done: a crash before leaves
// its layer under the work lease, or in the chain of the container's key, unlisted.
func (ck *checkpointRun) freezeRecorded(ctx context.Context, sn snapshots.Snapshotter, meta checkpoint.Meta) (string, error) {
	cs, err := ck.s.daemon.containers()
	if err != nil {
		return "", err
	}
	on, err := freeze.Rootfs(ctx, sn, cs, ck.lm, ck.c.id, meta.Frozen, layerLabels(meta))
	if err != nil {
		return on, err
	}
	return on, ck.record(ctx, meta)
}

// criuOpts are the engine's options for this checkpoint's dump (exit: its processes end) or for
// the restore of that dump.
func (ck *checkpointRun) criuOpts(exit bool) runtime.CheckpointOpts {
	o := criuOptions(ck.path, ck.work, dumpFlags(ck.opts), exit)
	o.EmptyNamespaces = ck.opts.EmptyNamespaces
	o.CgroupsMode = ck.opts.CgroupsMode
	return o
}

// record writes the metadata into the image directory and lists the checkpoint (its lease).
func (ck *checkpointRun) record(ctx context.Context, meta checkpoint.Meta) error {
	if err := ck.writeMeta(&meta); err != nil {
		return err
	}
	ck.t.mark("metaFile")
	return ck.list(ctx, meta)
}

// writeMeta sizes the dump's images into meta and writes meta into the image directory.
func (ck *checkpointRun) writeMeta(meta *checkpoint.Meta) error {
	// Without CRIU (a filesystem-only checkpoint) nothing has made the directory yet.
	if err := os.MkdirAll(ck.path, 0o700); err != nil {
		return fmt.Errorf("checkpoint image directory: %w", err)
	}
	var err error
	if meta.MemoryBytes, err = checkpoint.ImageSize(ck.path); err != nil {
		return fmt.Errorf("size of checkpoint images: %w", err)
	}
	return checkpoint.Write(ck.path, *meta)
}

// list creates the checkpoint's lease, which lists it, once its metadata is written and its
// layer committed, and records that the container descends from it. The lineage is set beside
// the lease (two containerd round trips at once), or before it, beside CRIU's dump, once a
// capture's layer is committed there (startDescend); it is set back if the checkpoint is not
// listed (undescend): a crash in between leaves a lineage naming an unlisted checkpoint, which
// refuses no rollback the lineage before it allowed but for one that the oldest entry, pushed
// out, allowed (--force-foreign).
func (ck *checkpointRun) list(ctx context.Context, meta checkpoint.Meta) error {
	// Only a directory the client named outlives the call; the daemon's temporary one does not.
	rec := checkpoint.Record{Meta: meta, ImagePath: ck.opts.ImagePath}
	ck.startDescend(ctx, meta)
	_, err := checkpoint.Hold(ctx, ck.lm, rec)
	<-ck.descended
	ck.t.mark("listed")
	if err != nil {
		os.Remove(filepath.Join(ck.path, checkpoint.MetaFile))
		return err
	}
	ck.listed = true
	return nil
}

// startDescend records, in the background, that the container descends from checkpoint meta,
// unless that was started already.
func (ck *checkpointRun) startDescend(ctx context.Context, meta checkpoint.Meta) {
	if ck.descended != nil {
		return
	}
	ck.descended, ck.lineage = make(chan struct{}), meta.Lineage
	go func() {
		defer close(ck.descended)
		ck.s.descend(ctx, ck.c.id, meta)
	}()
}

// undescend sets the container's lineage back to what it was before the checkpoint, once its
// recording (startDescend) has ended, when the checkpoint was not listed.
func (ck *checkpointRun) undescend(ctx context.Context) {
	if ck.descended == nil || ck.listed {
		return
	}
	<-ck.descended
	ck.s.recordLineage(context.WithoutCancel(ctx), ck.c.id, checkpoint.ParseLineage(ck.lineage))
}

// descend records that container id's state now descends from checkpoint meta (taken of it,
// restored or rolled back to). A failure is logged, not returned: the checkpoint or restore is
// done, and a lineage left behind only refuses rollbacks that --force-foreign still allows.
func (s *service) descend(ctx context.Context, id string, meta checkpoint.Meta) {
	s.recordLineage(ctx, id, checkpoint.Descend(meta.ID, checkpoint.ParseLineage(meta.Lineage)))
}

// recordLineage sets container id's lineage to l (none when l is empty), logging a failure.
func (s *service) recordLineage(ctx context.Context, id string, l checkpoint.Lineage) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err == nil {
		err = s.daemon.setLineage(ctx, ns, id, l)
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("lineage", l.String()).Warn("lineage not recorded")
	}
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
