package shim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/snapshotter/freeze"
)

// rollbackInPlace rolls a running (or paused) task back to the checkpoint in the image directory
// dir without ending the task: its processes are killed, its rootfs is stacked on the
// checkpoint's frozen layer (a memory-only checkpoint keeps the current files) and CRIU restores
// the checkpoint's processes into the same container, with the same stdio and, held across, the
// same network namespace: interfaces, addresses and routes stay, where a rollback through a new
// task gets a new namespace. A paused task comes back paused.
//
// If the restore fails the task ends (its exit is published) and the checkpoint is untouched.
//
// A checkpoint outside the container's lineage is refused unless forceForeign
// (checkpoint.MayRollBack): the shim decides, whichever client asks.
func (s *service) rollbackInPlace(ctx context.Context, c *container, dir string, forceForeign bool) error {
	t := newSteps()
	start := t.last
	meta, sn, key, err := s.rollbackTarget(ctx, c, dir, forceForeign, t)
	if err != nil {
		return err
	}
	c.lifecycle.Lock()
	defer c.lifecycle.Unlock()
	from, err := c.init.transition("roll back", statusRestoring)
	if err != nil {
		return err
	}
	defer c.init.settle(statusRestoring, from) // the kill failed: nothing changed
	release := s.reaper.hold()
	defer release()
	t.mark("lock")

	work := filepath.Join(c.bundle, "criu-work")
	defer os.RemoveAll(work)
	ip := &inPlace{
		s: s, c: c, what: "rollback", sn: sn, key: key, t: t,
		discards: meta.Contents.HasFS(), // a memory-only checkpoint keeps the key
		dump:     meta.Dump,
		restore:  criuOptions(dir, work, meta.Dump, false),
		stop: func() error {
			if err := c.engine().Signal(unix.SIGKILL, true); err != nil {
				return fmt.Errorf("roll back: kill the task: %w", err)
			}
			return nil
		},
	}
	lineage := map[string]string{checkpoint.LineageKey: checkpoint.Descend(meta.ID, checkpoint.ParseLineage(meta.Lineage)).String()}
	var sw freeze.Switched
	ip.switchRootfs = func(ctx context.Context) error {
		if !meta.Contents.HasFS() {
			return nil // a memory-only checkpoint keeps the current files
		}
		// The lineage is recorded in the switch's update of the container.
		var err error
		if sw, err = s.switchRootfs(ctx, sn, c.id, meta, lineage); err == nil {
			ip.key, ip.mounts = sw.Key, sw.Mounts // the restore mounts the fresh key, as prepared
		}
		return err
	}
	// Once the task is killed only the switch and the restore bring it back: they must not end
	// with the request, which ttrpc cancels when containerd goes away (a crash, a restart). They
	// are bounded on their own (the switch's retries, the restore's limits).
	res, err := ip.run(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	// The old mount's end and the replaced key's removal wait for no one: after the answer
	// (Delete waits for them). The key goes once its mount has ended: its removal may hand its
	// upper over (snapshotter/lend.go), which must not be mounted.
	c.finishing.Go(func() {
		res.release()
		if sw.Key != "" {
			sw.Finish(context.WithoutCancel(ctx))
		}
	})
	if res.stopped != nil {
		return fmt.Errorf("roll back to checkpoint %s (kept in %s): the task could not be restored and has stopped: %w", meta.ID, dir, res.stopped)
	}
	c.rolledBack.Store(true)
	if !meta.Contents.HasFS() {
		s.descend(ctx, c.id, meta)
		t.mark("lineage")
	}
	restoreStats(ctx, work, t.fields)
	t.fields["total"] = time.Since(start)
	log.G(ctx).WithFields(t.fields).WithField("checkpoint", meta.ID).Info("rolled back in place: rollback steps")
	return nil
}

// rollbackTarget reads and checks the checkpoint in dir before anything is stopped: in the
// container's lineage (or forceForeign), holding processes, admitted, and its frozen layer there
// to stack the rootfs on. It returns the checkpoint, the container's snapshotter and rootfs key.
func (s *service) rollbackTarget(ctx context.Context, c *container, dir string, forceForeign bool, t *steps) (checkpoint.Meta, snapshots.Snapshotter, string, error) {
	meta, err := checkpoint.Read(dir)
	if err != nil {
		return meta, nil, "", err
	}
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return meta, nil, "", err
	}
	rs, err := s.daemon.containerRootfs(ctx, ns, c.id)
	if err != nil {
		return meta, nil, "", err
	}
	t.mark("container")
	if err := checkpoint.MayRollBack(c.id, checkpoint.ParseLineage(rs.labels[checkpoint.LineageKey]), meta, forceForeign); err != nil {
		return meta, nil, "", err
	}
	if !meta.Contents.HasMemory() {
		return meta, nil, "", fmt.Errorf("checkpoint %s holds no processes (contents %s): start a new task from it: %w", meta.ID, meta.Contents, errdefs.ErrFailedPrecondition)
	}
	if err := sameInit(c, meta); err != nil {
		return meta, nil, "", err
	}
	if err := s.admit(dir, c.spec, c.rootfs); err != nil {
		return meta, nil, "", err
	}
	t.mark("admit")
	var sn snapshots.Snapshotter
	if meta.Contents.HasFS() {
		sn, err = s.restoreSnapshotter(ctx, rs, c.id, meta)
	} else {
		sn, err = s.daemon.snapshotter(rs.snapshotter)
	}
	t.mark("layer")
	return meta, sn, rs.key, err
}

// restoreStats adds CRIU's account of the restore that ran in work (stats-restore: the whole
// restore and the forking of the tree, in CRIU's own clock) to a steps line.
func restoreStats(ctx context.Context, work string, f log.Fields) {
	dir, err := os.Open(work)
	if err == nil {
		defer dir.Close()
		var st *stats.RestoreStatsEntry
		if st, err = stats.CriuGetRestoreStats(dir); err == nil {
			f["criu"] = time.Duration(st.GetRestoreTime()) * time.Microsecond
			f["criu forking"] = time.Duration(st.GetForkingTime()) * time.Microsecond
			return
		}
	}
	log.G(ctx).WithError(err).Debug("no CRIU restore stats")
}
