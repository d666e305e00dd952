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
// switchWrites entries to write or switchBytes bytes it costs more than the in-place cycle (a
// dump that stops the task, the upper frozen as it is in O(1), a restore on a fresh, empty
// upper), which the checkpoint then takes: the next captures start again from an empty upper.
// docs/checkpoints.md has the measurements behind the numbers.
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
	cp, rec, lctx, err := ck.frozen(ctx, sn, key, meta, dump, limit, t)
	if err != nil {
		return err
	}
	if rec, err = ck.commit(ctx, lctx, sn, cp, rec, meta); err != nil {
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
// had paused it: whatever fails, the capture is aborted (its layer removed if it was committed)
// and the task runs on as it was. The dump, the walk and the copy of what changed happen while
// it is frozen, and what of the commit and the lineage's update fits beside the dump. Of the
// snapshot calls (through containerd), those that find the upper come first, and with limit the
// switch rule is applied before anything is dumped (switchBeforeDump); the capture's snapshot is
// prepared while the task is frozen and dumped, and the capture written beside the dump is
// committed there too (CRIU's time, which the round trips then cost nothing of; the thaw does not
// wait for the commit); a capture written after the dump is committed once the task is thawed.
// It returns the capture, written, its layer's record if it was committed, and ctx under the
// checkpoint's work lease.
func (ck *checkpointRun) frozen(ctx context.Context, sn snapshots.Snapshotter, key string, meta checkpoint.Meta, dump func() error, limit bool, t *steps) (*capture.Capture, *capture.Record, context.Context, error) {
	cp, err := capture.Open(ctx, sn, key, meta.Frozen, ck.c.captured)
	if err != nil {
		return nil, nil, nil, err
	}
	t.mark("open")
	eng := ck.c.engine()
	clientPaused := eng.Paused()
	if limit {
		if err := ck.switchBeforeDump(cp, clientPaused, t); err != nil {
			return nil, nil, nil, err
		}
	}
	prepared := ck.prepareCapture(ctx, sn, cp)
	fc := &frozenCapture{cp: cp, limit: limit, clientPaused: clientPaused, prepared: prepared,
		watch: func() (seizeWaiter, error) { return eng.WatchSeized() },
		commit: func(lctx context.Context) (*capture.Record, error) {
			rec, err := cp.Commit(lctx, sn, layerLabels(meta))
			if err == nil {
				// The lineage too goes beside the dump, off the time after the thaw.
				ck.startDescend(ctx, meta)
			}
			return rec, err
		}}
	err = ck.whileFrozen(ctx, fc, dump, t)
	lctx, perr := prepared()
	rec, cerr := fc.waitCommit(t)
	if err == nil {
		err = errors.Join(perr, cerr)
	}
	if err != nil {
		abortCapture(ctx, sn, cp)
		return nil, nil, nil, err
	}
	return cp, rec, lctx, nil
}

// abortCapture removes the capture of a checkpoint that failed: its snapshot, or its layer once
// committed. What the snapshotter does not remove goes with the checkpoint's work lease.
func abortCapture(ctx context.Context, sn snapshots.Snapshotter, cp *capture.Capture) {
	if err := cp.Abort(ctx, sn); err != nil {
		log.G(ctx).WithError(err).Warn("abort the capture: it goes with the work lease")
	}
}

// layerLabels are the labels of checkpoint meta's frozen layer.
func layerLabels(meta checkpoint.Meta) map[string]string {
	return map[string]string{checkpoint.LabelID: meta.ID}
}

// commit commits the written capture as the checkpoint's layer, unless that was done beside the
// dump (rec), and records the checkpoint, or removes both. The image directory's metadata is
// written while the layer is committed (one file beside a synced transaction of containerd's and
// one of the snapshotter's); the checkpoint is listed (its lease) only once both are done, so a
// crash before leaves nothing listed: a metadata file without a lease, or a layer under the work
// lease, as before.
func (ck *checkpointRun) commit(ctx, lctx context.Context, sn snapshots.Snapshotter, cp *capture.Capture, rec *capture.Record, meta checkpoint.Meta) (*capture.Record, error) {
	t := ck.t
	var err error
	if meta.Parent, err = ck.baseCheckpoint(ctx, sn, cp.Base()); err != nil {
		abortCapture(ctx, sn, cp)
		return nil, err
	}
	t.mark("parent")
	var werr error
	if rec == nil {
		written := make(chan error, 1)
		go func() {
			start := time.Now()
			err := ck.writeMeta(&meta)
			t.fields["metaFile"] = time.Since(start) // beside the commit
			written <- err
		}()
		rec, err = cp.Commit(lctx, sn, layerLabels(meta))
		werr = <-written
	} else {
		werr = ck.writeMeta(&meta) // the layer was committed beside the dump
	}
	t.mark("commit")
	if err == nil && werr == nil {
		err = ck.list(lctx, meta)
	}
	if err == nil {
		return rec, nil
	}
	if rec != nil {
		abortCapture(ctx, sn, cp)
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
// thread of the task (besideDump), and its commit starts there once it is written, else it runs
// after the dump; either way it is kept only if the dump succeeded and left the cgroup frozen.
func (ck *checkpointRun) whileFrozen(ctx context.Context, fc *frozenCapture, dump func() error, t *steps) (err error) {
	eng := ck.c.engine()
	if !fc.clientPaused {
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
	defer fc.log(t)
	if dump == nil {
		return fc.run()
	}
	bd := startBesideDump(ctx, fc.watch, fc.runAndCommit)
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
// switch rule and the write of what changed, once the capture's snapshot is prepared; beside
// the dump, the commit of what it wrote follows in the background.
type frozenCapture struct {
	cp                  *capture.Capture
	limit, clientPaused bool
	prepared            func() (context.Context, error) // ctx under the work lease
	watch               func() (seizeWaiter, error)     // when CRIU holds the task (runtime.SeizeWatch)
	commit              func(context.Context) (*capture.Record, error)
	beside              bool // it ran beside the dump
	waited, walked      time.Duration
	copied              time.Duration
	// committing waits for a commit started beside the dump (nil: none was), which took
	// committed.
	committing func() (*capture.Record, error)
	committed  time.Duration
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

// runAndCommit is run beside the dump, then starts the commit of the written capture as the
// layer in the background (waitCommit waits for it): containerd's and the snapshotter's synced
// transactions then run inside CRIU's time instead of after the thaw, and the thaw, which needs
// the capture written, not committed, never waits for them. A dump that then fails, or a cgroup
// found thawed, drops the layer (frozen's Abort), unlisted.
func (fc *frozenCapture) runAndCommit() error {
	if err := fc.run(); err != nil {
		return err
	}
	fc.committing = inBackground(func() (*capture.Record, error) {
		start := time.Now()
		lctx, _ := fc.prepared() // run waited for it, and failed if it had
		rec, err := fc.commit(lctx)
		fc.committed = time.Since(start)
		return rec, err
	})
	return nil
}

// waitCommit waits for the commit started beside the dump, if one was, and returns its layer
// (nil when none was started) or why it failed.
func (fc *frozenCapture) waitCommit(t *steps) (*capture.Record, error) {
	if fc.committing == nil {
		return nil, nil
	}
	rec, err := fc.committing()
	t.mark("commitWait") // what of the commit outlasted the dump and the thaw
	t.fields["commitBeside"] = fc.committed
	return rec, err
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
func (ck *checkpointRun) switchBeforeDump(cp *capture.Capture, paused bool, t *steps) error {
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

// prepareCapture runs the capture's Prepare, under the checkpoint's work lease, in the
// background; the function returned waits for it and gives ctx under the lease.
func (ck *checkpointRun) prepareCapture(ctx context.Context, sn snapshots.Snapshotter, cp *capture.Capture) func() (context.Context, error) {
	return inBackground(func() (context.Context, error) {
		lctx, err := ck.lease.under(ctx)
		if err == nil {
			err = cp.Prepare(lctx, sn)
		}
		return lctx, err
	})
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
