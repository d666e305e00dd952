package shim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
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
	if err := admitImages(dir, c.spec); err != nil {
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
	c.checkpointMu.Lock()
	defer c.checkpointMu.Unlock()
	release := s.reaper.hold()
	defer release()

	ck := &checkpointRun{s: s, c: c, path: dir, work: filepath.Join(c.bundle, "criu-work"), dump: meta.Dump, opts: &options.CheckpointOptions{
		OpenTcp:             meta.Dump.OpenTCP,
		ExternalUnixSockets: meta.Dump.ExternalUnixSockets,
		Terminal:            meta.Dump.Terminal,
		FileLocks:           meta.Dump.FileLocks,
	}}
	defer os.RemoveAll(ck.work)
	held, err := holdTask(c, meta.Dump.ExternalNetNS)
	if err != nil {
		return err
	}
	defer held.Close()
	paused := c.engine.Paused()
	pid := c.init.getPid()
	start := time.Now()
	exited := c.init.beginHandover()
	if err := c.engine.Signal(unix.SIGKILL, true); err != nil {
		if code, gone := c.init.endHandover(); gone {
			s.initExited(c, c.init, pid, code)
		}
		return fmt.Errorf("roll back: kill the task: %w", err)
	}
	code := <-exited
	err = c.engine.Destroy()
	if err == nil {
		err = c.unmountRootfs(ctx)
	}
	if err == nil && meta.Contents.HasFS() {
		_, err = s.rootfsForRestore(ctx, ns, c.id, meta)
	}
	if err == nil {
		err = ck.restoreInPlace(ctx, sn, rs.key, held, paused)
	}
	c.init.endHandover()
	if err != nil {
		s.initExited(c, c.init, pid, code)
		return fmt.Errorf("roll back to checkpoint %s (kept in %s): the task could not be restored and has stopped: %w", meta.ID, dir, err)
	}
	log.G(ctx).WithFields(log.Fields{"checkpoint": meta.ID, "took": time.Since(start)}).Info("rolled back in place")
	s.descend(ctx, c.id, meta)
	return nil
}
