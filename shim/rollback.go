package shim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/checkpoint"
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
	meta, err := checkpoint.Read(dir)
	if err != nil {
		return err
	}
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return err
	}
	rs, err := s.daemon.containerRootfs(ctx, ns, c.id)
	if err != nil {
		return err
	}
	if err := checkpoint.MayRollBack(c.id, checkpoint.ParseLineage(rs.labels[checkpoint.LineageKey]), meta, forceForeign); err != nil {
		return err
	}
	if !meta.Contents.HasMemory() {
		return fmt.Errorf("checkpoint %s holds no processes (contents %s): start a new task from it: %w", meta.ID, meta.Contents, errdefs.ErrFailedPrecondition)
	}
	if err := sameInit(c, meta); err != nil {
		return err
	}
	if err := s.admit(dir, c.spec, c.rootfs); err != nil {
		return err
	}
	sn, err := s.daemon.snapshotter(rs.snapshotter)
	if err != nil {
		return err
	}
	if meta.Contents.HasFS() {
		// Before anything is killed: a checkpoint whose layer is gone fails here.
		if err := s.frozenLayerExists(ctx, sn, meta); err != nil {
			return err
		}
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

	work := filepath.Join(c.bundle, "criu-work")
	defer os.RemoveAll(work)
	ip := &inPlace{
		s: s, c: c, what: "rollback", sn: sn, key: rs.key,
		dump:    meta.Dump,
		restore: criuOptions(dir, work, meta.Dump, false),
		stop: func() error {
			if err := c.engine().Signal(unix.SIGKILL, true); err != nil {
				return fmt.Errorf("roll back: kill the task: %w", err)
			}
			return nil
		},
	}
	ip.switchRootfs = func(ctx context.Context) error {
		if !meta.Contents.HasFS() {
			return nil // a memory-only checkpoint keeps the current files
		}
		sw, err := s.rootfsForRestore(ctx, ns, c.id, meta)
		if err == nil {
			ip.key = sw.Key // the restore mounts the fresh key
		}
		return err
	}
	start := time.Now()
	// Once the task is killed only the switch and the restore bring it back: they must not end
	// with the request, which ttrpc cancels when containerd goes away (a crash, a restart). They
	// are bounded on their own (the switch's retries, the restore's limits).
	res, err := ip.run(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	if res.stopped != nil {
		return fmt.Errorf("roll back to checkpoint %s (kept in %s): the task could not be restored and has stopped: %w", meta.ID, dir, res.stopped)
	}
	log.G(ctx).WithFields(log.Fields{"checkpoint": meta.ID, "took": time.Since(start)}).Info("rolled back in place")
	s.descend(ctx, c.id, meta)
	return nil
}
