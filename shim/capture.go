package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/snapshotter/capture"
)

// A checkpoint that leaves the task running never stops it: the task's cgroup is frozen, CRIU
// dumps it leaving it running (it finds the cgroup frozen and leaves it frozen), the rootfs
// upper is captured into the checkpoint's layer (package capture: what changed since the
// previous capture), the cgroup is thawed and the checkpoint recorded. No unmount, no remount,
// no CRIU restore: the same processes run on, on the same mount, and the container's snapshot
// key is never removed or renamed, so a crash at any step leaves the task running on its rootfs.
// A filesystem-only checkpoint is the same without the dump; one with Exit after a capture is the
// same with a dump that kills the task.
//
// The switch rule: a capture costs a walk of the upper (O(entries)) and a write of what changed
// (O(entries written) plus O(bytes)), both while the task is frozen. Past switchEntries entries,
// switchWrites entries to write or switchBytes bytes it costs more than today's in-place cycle (a dump that stops the task, the upper frozen as it is in
// O(1), a restore on a fresh, empty upper), which the checkpoint then takes: the next captures
// start again from an empty upper. docs/checkpoints.md has the measurements behind the numbers.
//
// A client that paused the task before the checkpoint (containerd's Go client, ctr, nerdctl and
// the CRI do for a runtime not named runc) diffs the container's snapshot once it returns, the task
// still paused: that diff is of the whole upper, which captures leave as it is. Past
// switchDiffBytes in the upper the in-place cycle, which leaves an empty upper to diff, is cheaper
// for such a client.
const (
	switchEntries   = 20000
	switchWrites    = 500
	switchBytes     = 64 << 20
	switchDiffBytes = 1 << 20
)

// errSwitch says that the capture would cost more than the in-place cycle.
var errSwitch = errors.New("the upper is past the switch rule's limits")

// captureRootfs checkpoints the rootfs (and with dump the processes) of the running or paused
// task, leaving it as it was, and records the checkpoint. With limit, errSwitch says that the
// in-place cycle must do it instead; nothing was recorded then.
func (ck *checkpointRun) captureRootfs(ctx context.Context, sn snapshots.Snapshotter, key string, meta checkpoint.Meta, dump func() error, limit bool) error {
	c := ck.c
	if limit && c.captured.Len() > switchEntries {
		return fmt.Errorf("%w: %d entries", errSwitch, c.captured.Len())
	}
	t := ck.t
	cp, lctx, err := ck.frozen(ctx, sn, key, meta, dump, limit, t)
	if err != nil {
		return err
	}
	rec, err := ck.commit(ctx, lctx, sn, cp, meta)
	if err != nil {
		return err
	}
	c.captured = rec
	// Saved beside the upper for a later shim of the same rootfs (a task started again), off
	// the checkpoint's path (the task's delete waits for it): a record lost costs that shim's
	// first capture a whole upper.
	c.saves.Add(1)
	go func() {
		defer c.saves.Done()
		if err := rec.Save(); err != nil {
			log.G(ctx).WithError(err).Warn("save the capture's record")
		}
	}()
	log.G(ctx).WithField("id", meta.ID).Info("checkpoint taken, task left running")
	return nil
}

// frozen dumps and captures while the task's cgroup is frozen, then thaws it unless the client
// had paused it: whatever fails, the capture is aborted and the task runs on as it was. Only the
// dump, the walk and the copy of what changed happen while it is frozen. Of the snapshot calls
// (through containerd), those that find the upper come first, and with limit an estimate of the
// capture (a walk while the task runs) applies the switch rule before anything is dumped; the
// capture's snapshot is prepared while the task is frozen and dumped (CRIU's time, which the
// round trips then cost nothing of), the commit comes once it is thawed. It returns the
// capture, written, and ctx under the checkpoint's work lease.
func (ck *checkpointRun) frozen(ctx context.Context, sn snapshots.Snapshotter, key string, meta checkpoint.Meta, dump func() error, limit bool, t *steps) (*capture.Capture, context.Context, error) {
	cp, err := capture.Open(ctx, sn, key, meta.Frozen, ck.c.captured)
	if err != nil {
		return nil, nil, err
	}
	t.mark("open")
	if limit {
		if err := ck.switchBeforeDump(cp, t); err != nil {
			return nil, nil, err
		}
	}
	p := ck.prepareCapture(ctx, sn, cp)
	err = ck.whileFrozen(ctx, cp, dump, limit, t, p.wait)
	lctx, perr := p.wait()
	if err == nil {
		err = perr
	}
	if err != nil {
		cp.Abort(ctx, sn)
		return nil, nil, err
	}
	return cp, lctx, nil
}

// commit commits the written capture as the checkpoint's layer and records the checkpoint, or
// removes both. The image directory's metadata is written while the layer is committed (one
// file beside a synced transaction of containerd's and one of the snapshotter's); the checkpoint
// is listed (its lease) only once both are done, so a crash before leaves nothing listed: a
// metadata file without a lease, or a layer under the work lease, as before.
func (ck *checkpointRun) commit(ctx, lctx context.Context, sn snapshots.Snapshotter, cp *capture.Capture, meta checkpoint.Meta) (*capture.Record, error) {
	t := ck.t
	var err error
	if meta.Parent, err = ck.baseCheckpoint(ctx, sn, cp.Base()); err != nil {
		cp.Abort(ctx, sn)
		return nil, err
	}
	t.mark("parent")
	written := make(chan error, 1)
	go func() {
		start := time.Now()
		err := ck.writeMeta(&meta)
		t.fields["metaFile"] = time.Since(start) // beside the commit
		written <- err
	}()
	rec, err := cp.Commit(lctx, sn, map[string]string{checkpoint.LabelID: meta.ID})
	werr := <-written
	t.mark("commit")
	if err == nil && werr == nil {
		err = ck.list(lctx, meta)
	}
	if err == nil {
		return rec, nil
	}
	if rec != nil {
		if rerr := sn.Remove(context.WithoutCancel(ctx), meta.Frozen); rerr != nil {
			log.G(ctx).WithError(rerr).WithField("frozen", meta.Frozen).Warn("remove the unrecorded capture")
		}
	}
	if werr == nil {
		os.Remove(filepath.Join(ck.path, checkpoint.MetaFile))
	}
	return nil, errors.Join(err, werr)
}

// whileFrozen freezes the task's cgroup unless the client paused it, dumps it and captures its
// upper, then thaws it again. A leave-running dump freezes the cgroup itself and leaves it frozen
// (KeepFrozen: CRIU freezes it at its seize when it can, runtime.Container.Checkpoint first
// otherwise), so the task runs on through CRIU's start; "frozen" then counts from the dump's
// start, an upper bound. The capture runs beside the dump from the moment CRIU holds every
// thread of the task (besideDump), else after it; either way it is kept only if the dump
// succeeded and left the cgroup frozen.
func (ck *checkpointRun) whileFrozen(ctx context.Context, cp *capture.Capture, dump func() error, limit bool, t *steps, prepared func() (context.Context, error)) (err error) {
	eng := ck.c.engine()
	clientPaused := eng.Paused()
	if !clientPaused {
		start := time.Now()
		if dump == nil || ck.opts.Exit {
			if err := eng.Pause(); err != nil {
				return err
			}
			t.mark("freeze")
		}
		defer func() {
			// After a dump with Exit, the thaw only lets the killed processes die.
			if rerr := eng.Resume(); rerr != nil && err == nil && !ck.opts.Exit {
				err = fmt.Errorf("thaw the task after its checkpoint: %w", rerr)
			}
			t.mark("thaw")
			t.fields["frozen"] = time.Since(start) // what the task saw of the checkpoint
		}()
	}
	fc := &frozenCapture{cp: cp, limit: limit, clientPaused: clientPaused, prepared: prepared}
	defer fc.log(t)
	if dump == nil {
		return fc.run()
	}
	bd := startBesideDump(ctx, func() (seizeWaiter, error) { return eng.WatchSeized() }, fc.run)
	t.mark("watch")
	derr := dump()
	t.mark("dump")
	fc.beside, err = bd.end()
	t.mark("captured") // what the dump's end waited for the capture beside it
	if derr != nil {
		return derr
	}
	if !ck.opts.Exit && !eng.Paused() {
		// The capture would race with the running task.
		return fmt.Errorf("the task's cgroup was thawed by CRIU's dump: its filesystem cannot be captured consistently")
	}
	if !fc.beside {
		err = fc.run()
		t.mark("captured")
	}
	return err
}

// frozenCapture is the part of a capture that needs the task still: the walk of its upper, the
// switch rule and the write of what changed, once the capture's snapshot is prepared.
type frozenCapture struct {
	cp                     *capture.Capture
	limit, clientPaused    bool
	prepared               func() (context.Context, error)
	beside                 bool // it ran beside the dump
	waited, walked, copied time.Duration
}

func (fc *frozenCapture) run() error {
	start := time.Now()
	if _, err := fc.prepared(); err != nil {
		return err
	}
	fc.waited = time.Since(start)
	if err := fc.cp.Walk(); err != nil {
		return err
	}
	fc.walked = time.Since(start) - fc.waited
	if fc.limit {
		// What the estimate did not see: written while the task was being frozen and dumped,
		// or the previous capture's layer gone. The checkpoint then dumps twice.
		if err := switchRule(fc.cp.Stats(), fc.clientPaused); err != nil {
			return err
		}
	}
	if err := fc.cp.Write(); err != nil {
		return err
	}
	fc.copied = time.Since(start) - fc.waited - fc.walked
	return nil
}

// log adds the capture's steps and what it saw to the checkpoint's log line.
func (fc *frozenCapture) log(t *steps) {
	st := fc.cp.Stats()
	t.fields["prepared"], t.fields["walk"], t.fields["write"], t.fields["besideDump"] = fc.waited, fc.walked, fc.copied, fc.beside
	t.fields["entries"], t.fields["writes"], t.fields["bytes"], t.fields["delta"] = st.Entries, st.Writes, st.Bytes, st.Delta
}

// besideDump runs a capture beside CRIU's dump from the moment CRIU holds every thread of the
// task (runtime.SeizeWatch): the task cannot change its files from then until the thaw after the
// dump, so the walk and the write leave the task's downtime and the checkpoint's time, but for
// what of them outlasts CRIU. Where the watch cannot tell (no freezer cgroup), or the dump ends
// first, the capture runs after the dump, as before.
type besideDump struct {
	stop, done chan struct{}
	started    bool // the capture ran, beside the dump
	err        error
}

func startBesideDump(ctx context.Context, watch func() (seizeWaiter, error), capture func() error) *besideDump {
	bd := &besideDump{stop: make(chan struct{}), done: make(chan struct{})}
	w, err := watch()
	if err != nil {
		log.G(ctx).WithError(err).Debug("checkpoint: the capture waits for the dump's end")
		close(bd.done)
		return bd
	}
	go func() {
		defer close(bd.done)
		held, err := w.Wait(bd.stop)
		if err != nil {
			log.G(ctx).WithError(err).Warn("checkpoint: the capture waits for the dump's end")
		}
		if held {
			bd.started, bd.err = true, capture()
		}
	}()
	return bd
}

// seizeWaiter waits for CRIU to hold every thread of the task (runtime.SeizeWatch), or for stop.
type seizeWaiter interface {
	Wait(stop <-chan struct{}) (held bool, err error)
}

// end stops the watch once the dump has ended and waits for a capture that started; started
// says whether one did, err how it ended.
func (bd *besideDump) end() (started bool, err error) {
	close(bd.stop)
	<-bd.done
	return bd.started, bd.err
}

// switchBeforeDump applies the switch rule before the dump, so that a checkpoint past it dumps
// once. The estimate walks the whole upper (O(entries): 26 ms for the python agent's ~2000 files
// under load), so it runs only where the upper's growth since the previous capture (its
// filesystem's use, one statfs) could put the capture past a limit, and where there is no
// previous capture. A file rewritten in place takes no new blocks: the walk after the dump still
// applies the rule to it (and the checkpoint then dumps twice).
func (ck *checkpointRun) switchBeforeDump(cp *capture.Capture, t *steps) error {
	paused := ck.c.engine().Paused()
	g, ok, err := cp.Growth()
	if err != nil {
		return err
	}
	if ok && g.Bytes <= switchBytes && g.Entries <= switchEntries && g.New <= switchWrites && (!paused || g.Size <= switchDiffBytes) {
		t.mark("growth")
		return nil
	}
	st, err := cp.Estimate(switchEntries)
	if err != nil {
		return err
	}
	t.mark("estimate")
	return switchRule(st, paused)
}

// switchRule returns errSwitch when a capture that walks and writes st costs more than the
// in-place cycle (the limits above), for a task that the client paused or not.
func switchRule(st capture.Stats, clientPaused bool) error {
	if st.Entries > switchEntries || st.Writes > switchWrites || st.Bytes > switchBytes || clientPaused && st.Size > switchDiffBytes {
		return fmt.Errorf("%w: %d entries, %d to write, %d bytes changed, %d bytes in all, paused by the client: %t", errSwitch, st.Entries, st.Writes, st.Bytes, st.Size, clientPaused)
	}
	return nil
}

// preparing is a capture's Prepare (under the checkpoint's work lease) running in the background.
type preparing struct {
	done chan struct{}
	ctx  context.Context // under the work lease
	err  error
}

func (ck *checkpointRun) prepareCapture(ctx context.Context, sn snapshots.Snapshotter, cp *capture.Capture) *preparing {
	p := &preparing{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		if p.ctx, p.err = ck.lease.under(ctx); p.err == nil {
			p.err = cp.Prepare(p.ctx, sn)
		}
	}()
	return p
}

// wait waits for the Prepare and returns how it ended.
func (p *preparing) wait() (context.Context, error) {
	<-p.done
	return p.ctx, p.err
}

// baseCheckpoint is the checkpoint whose frozen layer base is: the previous capture's, known
// without asking the snapshotter, or another layer's.
func (ck *checkpointRun) baseCheckpoint(ctx context.Context, sn snapshots.Snapshotter, base string) (string, error) {
	if prev := ck.c.captured; prev != nil && base != "" && base == prev.Layer {
		return prev.Labels[checkpoint.LabelID], nil
	}
	return layerCheckpoint(ctx, sn, base)
}

// layerCheckpoint is the checkpoint whose frozen layer is layer, or "".
func layerCheckpoint(ctx context.Context, sn snapshots.Snapshotter, layer string) (string, error) {
	if layer == "" {
		return "", nil
	}
	info, err := sn.Stat(ctx, layer)
	if err != nil {
		return "", fmt.Errorf("layer %s the checkpoint is stacked on: %w", layer, err)
	}
	return info.Labels[checkpoint.LabelID], nil
}

// clearDump empties an image directory of a dump the checkpoint does not keep (the switch rule
// dumps again); the directory was empty before it (checkImageDir, or the daemon's own). The
// record of the execs' stdio stays: the next dump was prepared with it (captureExecs), under the
// same lifecycle lock, so no exec has started since.
func clearDump(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("clear the image directory %s: %w", dir, err)
	}
	for _, e := range entries {
		if e.Name() == execStdioFile {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("clear the image directory %s: %w", dir, err)
		}
	}
	return nil
}

// steps times the steps of a checkpoint for its log line.
type steps struct {
	start, last time.Time
	fields      log.Fields
}

func newSteps() *steps {
	now := time.Now()
	return &steps{start: now, last: now, fields: log.Fields{}}
}

func (s *steps) mark(name string) {
	now := time.Now()
	s.fields[name] = now.Sub(s.last)
	s.last = now
}
