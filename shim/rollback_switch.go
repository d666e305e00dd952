package shim

import (
	"context"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/snapshotter/freeze"
)

// rollbackSwitch sets ip's switch of the rootfs for a rollback of c to checkpoint meta: none for
// a memory-only checkpoint (it keeps the current files), else a switch prepared ahead whose update
// of the container also records c's lineage (descending from meta). The returned function ends it
// once ip has run: a switch prepared but not used is given up, a switch made is finished after
// the answer (the replaced key's removal; the task's Delete waits for it).
func (s *service) rollbackSwitch(ctx context.Context, c *container, ip *inPlace, meta checkpoint.Meta) func() {
	if !meta.Contents.HasFS() {
		ip.switchRootfs = func(context.Context) error { return nil }
		return func() {}
	}
	lineage := map[string]string{checkpoint.LineageKey: checkpoint.Descend(meta.ID, checkpoint.ParseLineage(meta.Lineage)).String()}
	ahead := s.prepareSwitch(context.WithoutCancel(ctx), ip.sn, c.id, meta)
	var sw freeze.Switched
	ip.switchRootfs = func(ctx context.Context) error {
		var err error
		if sw, err = ahead.commit(ctx, lineage); err == nil {
			ip.key = sw.Key // the restore mounts the fresh key
		}
		return err
	}
	return func() {
		ahead.abandon()
		if sw.Key != "" {
			c.finishing.Go(func() { sw.Finish(context.WithoutCancel(ctx)) })
		}
	}
}

// switchAhead is a rollback's switch of the rootfs with its first step (the fresh key on the
// checkpoint's layer: a container lookup, a Stat, a lease and a Prepare through containerd)
// taken while the task is being killed, destroyed and unmounted, which it does not touch: only
// the container's update waits for the rootfs to be unmounted. Should the early step fail, or
// its update, the switch is made again as a whole, with its retries (switchRootfs).
type switchAhead struct {
	s       *service
	sn      snapshots.Snapshotter
	id      string
	meta    checkpoint.Meta
	ready   chan struct{}
	pending *freeze.Pending
	err     error
	used    bool
}

// prepareSwitch starts the first step of container id's switch to checkpoint meta's layer. The
// caller holds the container's lifecycle lock (nothing else switches its key meanwhile).
func (s *service) prepareSwitch(ctx context.Context, sn snapshots.Snapshotter, id string, meta checkpoint.Meta) *switchAhead {
	a := &switchAhead{s: s, sn: sn, id: id, meta: meta, ready: make(chan struct{})}
	go func() {
		defer close(a.ready)
		cs, err := s.daemon.containers()
		if err != nil {
			a.err = err
			return
		}
		lm, err := s.daemon.leases()
		if err != nil {
			a.err = err
			return
		}
		a.pending, a.err = freeze.Prepare(ctx, sn, cs, lm, id, meta.Frozen)
	}()
	return a
}

// commit points the container at the fresh key, setting labels in the same update, once the
// rootfs is unmounted; the caller finishes the switch.
func (a *switchAhead) commit(ctx context.Context, labels map[string]string) (freeze.Switched, error) {
	<-a.ready
	a.used = true
	if a.err == nil {
		sw, err := a.pending.Commit(labels)
		if err == nil {
			return sw, nil
		}
		a.pending.Abort()
		a.err = err
	}
	log.G(ctx).WithError(a.err).Warn("the rollback's switch prepared ahead failed: switching again")
	return a.s.switchRootfs(ctx, a.sn, a.id, a.meta, labels)
}

// abandon gives up a switch that commit never used (the task could not be killed): its fresh key
// goes with its lease.
func (a *switchAhead) abandon() {
	<-a.ready
	if !a.used && a.err == nil {
		a.pending.Abort()
	}
}
