package shim

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/criuimage"
	"github.com/cklite/cklite/runtime"
	"github.com/cklite/cklite/snapshotter/freeze"
)

// Restore at Create: a container created from a checkpoint (ctr's --checkpoint, a checkpoint
// image, containerd's CriuImagePath) is created ready to restore, and Start restores its init.

// prepareRestore reads the checkpoint c is created from and returns the rootfs to mount for it:
// a cklite checkpoint with a filesystem brings its own (a fresh upper on its frozen layer), unless
// the container's image is the checkpoint (its rootfs already holds the checkpoint's files); a
// memory-only or stock CRIU image restores on the container's current rootfs. A checkpoint of the
// filesystem alone leaves nothing for CRIU: the process then starts afresh on that filesystem.
func (s *service) prepareRestore(ctx context.Context, ns string, c *container, rootfs []mount.Mount) ([]mount.Mount, error) {
	meta, err := checkpoint.Read(c.checkpoint)
	if errdefs.IsNotFound(err) {
		return rootfs, s.admit(c.checkpoint, c.spec, "") // a stock CRIU image
	}
	if err != nil {
		return nil, err
	}
	// A container made from a checkpoint image has its rootfs from the image: nothing changes
	// before its mount, after which the images are admitted with the spec's mount destinations
	// resolved in it (admitMounted). Any other restore is admitted before its rootfs switch.
	c.admitMounted = meta.Contents.HasMemory() && c.fromImage
	if meta.Contents.HasMemory() && !c.fromImage {
		if err := s.admit(c.checkpoint, c.spec, ""); err != nil {
			return nil, err
		}
	}
	c.dumped = meta.Dump
	s.restoredLineage(namespaces.WithNamespace(ctx, ns), c, meta)
	moveOwnCgroup(c.spec, meta.Container, c.id)
	if meta.Contents.HasFS() && !c.fromImage {
		sw, err := s.rootfsForRestore(ctx, ns, c.id, meta)
		if err != nil {
			return nil, err
		}
		rootfs = sw.Mounts
	}
	if !meta.Contents.HasMemory() {
		c.checkpoint = ""
	}
	return rootfs, nil
}

// restoredLineage records what container c, restored from the checkpoint of meta, descends
// from: that checkpoint and its lineage when this containerd holds that checkpoint with its images
// in the very directory c restores from, nothing otherwise. A directory's cklite.json is input
// like any image (security.md): one from a registry, an archive the kubelet unpacked or a copy
// names any checkpoint ids it likes, and a lineage taken from it would let c roll back in place
// to other containers' checkpoints on this host without --force-foreign (issue 13). The
// checkpoint's own record (its lease, with the directory its images were written to) is what
// this host made; a restore from anywhere else starts c's lineage afresh, and clearing the label
// also drops one the client may have copied from an image's config labels.
func (s *service) restoredLineage(ctx context.Context, c *container, meta checkpoint.Meta) {
	if c.fromImage || !s.recordedAt(ctx, meta.ID, c.checkpoint) {
		s.recordLineage(ctx, c.id, nil)
		return
	}
	s.descend(ctx, c.id, meta)
}

// recordedAt reports whether containerd records checkpoint id with its images in dir. An error
// (containerd unreachable, no such checkpoint) is a no: the lineage is then not trusted.
func (s *service) recordedAt(ctx context.Context, id, dir string) bool {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return false
	}
	lm, err := s.daemon.leases()
	if err != nil {
		return false
	}
	r, err := checkpoint.Recorded(ctx, lm, ns, id)
	if err != nil {
		if !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).WithField("checkpoint", id).Warn("checkpoint record not read: its lineage is not taken")
		}
		return false
	}
	return r.ImagePath != "" && filepath.Clean(r.ImagePath) == filepath.Clean(dir)
}

// admitImages checks a CRIU image directory before anything is restored from it: complete, and
// asking for nothing beyond spec (pkg/criuimage). Every restore is admitted, whatever made the
// image: it may come from another host, a registry or another container.
func admitImages(dir string, spec *specs.Spec, opts ...criuimage.AdmitOption) error {
	if err := checkpoint.CheckImages(dir); err != nil {
		return err
	}
	return criuimage.Admit(dir, spec, opts...)
}

// restoreConfig prepares the configuration of a container created to restore a checkpoint: the
// CRIU options its dump was taken with, and a network namespace to restore into.
func (c *container) restoreConfig(cfg *configs.Config) error {
	if c.checkpoint == "" {
		return nil
	}
	execs, err := nullExecStdio(c.checkpoint, &c.standIns)
	if err != nil {
		return err
	}
	c.execStdio = execs
	if opts := append(dumpCRIUOptions(c.dumped), execs.options...); len(opts) > 0 {
		if err := runtime.WithCRIUOptions(cfg, c.criuWork(), opts...); err != nil {
			return err
		}
	}
	return c.restoreNetNS(cfg)
}

// criuWork is the work directory of CRIU's restore at Start: the client's, or one in the bundle.
func (c *container) criuWork() string {
	if c.opts.CriuWorkPath != "" {
		return c.opts.CriuWorkPath
	}
	return filepath.Join(c.bundle, "criu-work")
}

// restoreNetNS gives a restore whose dump left the network namespace out a namespace to restore
// into: the one the spec names, or a new one with lo up, which the spec's hooks (CNI) configure.
func (c *container) restoreNetNS(cfg *configs.Config) error {
	if !c.dumped.ExternalNetNS {
		return nil
	}
	named, private := runtime.SpecNetNS(cfg)
	if named {
		return nil
	}
	if !private {
		return fmt.Errorf("checkpoint %s was taken in a network namespace of its own, container %s runs in the host's: %w",
			c.checkpoint, c.id, errdefs.ErrFailedPrecondition)
	}
	f, err := runtime.NewNetNS()
	if err != nil {
		return err
	}
	c.netns = f
	runtime.WithNetNS(cfg, f)
	return nil
}

// closeNetNS lets go of the restore's network namespace and of the stand-ins for the stdio of
// its exec'd processes: the restored processes hold them.
func (c *container) closeNetNS() {
	c.execStdio.Close()
	c.execStdio = nil
	if c.netns != nil {
		c.netns.Close()
		c.netns = nil
	}
}

// moveOwnCgroup gives a container restored from another container's checkpoint a cgroup of its
// own: a restore through ctr or the CRI reuses the checkpointed spec, whose cgroupsPath names
// the original container's cgroup, which is still busy when the restore is a fork.
func moveOwnCgroup(spec *specs.Spec, from, to string) {
	if spec.Linux == nil || from == to || path.Base(spec.Linux.CgroupsPath) != from {
		return
	}
	spec.Linux.CgroupsPath = path.Join(path.Dir(spec.Linux.CgroupsPath), to)
}

// restore brings the init back from the checkpoint given at Create.
func (s *service) restore(ctx context.Context, c *container) error {
	// CRIU's log goes to a work directory, kept out of the image (which may be read-only or
	// shared by forks) unless the client names one.
	work := c.criuWork()
	if c.opts.CriuWorkPath == "" {
		defer os.RemoveAll(work)
	}
	defer c.closeNetNS()
	rctx, limits, end, err := c.beginRestore(ctx, s.config)
	if err != nil {
		return err
	}
	defer end()
	release := s.reaper.hold()
	defer release()
	err = s.startInit(ctx, c, func(lp *libcontainer.Process) error {
		err := c.engine().Restore(rctx, lp, criuOptions(c.checkpoint, work, c.dumped, false), limits)
		if err != nil {
			return fmt.Errorf("restore from %s: %w", c.checkpoint, keepRestoreLog(c.bundle, work, err))
		}
		return nil
	}, statusRunning)
	if err != nil {
		return err
	}
	c.checkpoint = ""
	s.watchInit(ctx, c)
	return nil
}

// rootfsForRestore switches container id's rootfs to a fresh snapshot on the frozen layer of
// checkpoint meta (freeze.Switch: a crash at any moment leaves the container on a snapshot that
// exists) and returns it: what the container wrote since is discarded.
func (s *service) rootfsForRestore(ctx context.Context, ns, id string, meta checkpoint.Meta) (freeze.Switched, error) {
	ctx = namespaces.WithNamespace(ctx, ns)
	rs, err := s.daemon.containerRootfs(ctx, ns, id)
	if err != nil {
		return freeze.Switched{}, err
	}
	sn, err := s.restoreSnapshotter(ctx, rs, id, meta)
	if err != nil {
		return freeze.Switched{}, err
	}
	sw, err := s.switchRootfs(ctx, sn, id, meta, nil)
	if err != nil {
		return freeze.Switched{}, err
	}
	sw.Finish(ctx)
	return sw, nil
}

// restoreSnapshotter checks that container id, whose rootfs rs is, can take checkpoint meta's
// filesystem and returns the snapshotter that holds both.
func (s *service) restoreSnapshotter(ctx context.Context, rs rootfsSnapshot, id string, meta checkpoint.Meta) (snapshots.Snapshotter, error) {
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
	return sn, nil
}

// switchRootfs stacks container id's rootfs on checkpoint meta's frozen layer in sn, setting the
// container's labels in labels in the same update (freeze.Switch); the caller finishes the switch.
func (s *service) switchRootfs(ctx context.Context, sn snapshots.Snapshotter, id string, meta checkpoint.Meta, labels map[string]string) (freeze.Switched, error) {
	cs, err := s.daemon.containers()
	if err != nil {
		return freeze.Switched{}, err
	}
	lm, err := s.daemon.leases()
	if err != nil {
		return freeze.Switched{}, err
	}
	var sw freeze.Switched
	err = freeze.RetryUnavailable(ctx, freeze.RetryLimit, func() (err error) {
		sw, err = freeze.Switch(ctx, sn, cs, lm, id, meta.Frozen, labels)
		return err
	})
	if err != nil {
		return freeze.Switched{}, fmt.Errorf("stack the rootfs of container %s on frozen layer %s of checkpoint %s: %w", id, meta.Frozen, meta.ID, err)
	}
	return sw, nil
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
