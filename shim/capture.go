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
// The switch rule: a capture costs a walk of the upper (O(entries)) and a copy of what changed
// (O(bytes)), both while the task is frozen. Past switchEntries entries or switchBytes bytes it
// costs more than today's in-place cycle (a dump that stops the task, the upper frozen as it is in
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
	rec, base, lctx, err := ck.frozen(ctx, sn, key, meta, dump, limit, t)
	if err != nil {
		return err
	}
	if meta.Parent, err = ck.baseCheckpoint(ctx, sn, base); err == nil {
		t.mark("parent")
		err = ck.record(lctx, meta)
	}
	if err != nil {
		if rerr := sn.Remove(context.WithoutCancel(ctx), meta.Frozen); rerr != nil {
			log.G(ctx).WithError(rerr).WithField("frozen", meta.Frozen).Warn("remove the unrecorded capture")
		}
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
// had paused it, and commits the capture: whatever fails, the task runs on as it was. Only the
// dump, the walk and the copy of what changed happen while it is frozen. Of the snapshot calls
// (through containerd), those that find the upper come first, and with limit an estimate of the
// capture (a walk while the task runs) applies the switch rule before anything is dumped; the
// capture's snapshot is prepared while the task is frozen and dumped (CRIU's time, which the
// round trips then cost nothing of), the commit comes once it is thawed. It returns the
// capture's record, the layer it stacks on and ctx under the checkpoint's work lease.
func (ck *checkpointRun) frozen(ctx context.Context, sn snapshots.Snapshotter, key string, meta checkpoint.Meta, dump func() error, limit bool, t *steps) (*capture.Record, string, context.Context, error) {
	cp, err := capture.Open(ctx, sn, key, meta.Frozen, ck.c.captured)
	if err != nil {
		return nil, "", nil, err
	}
	t.mark("open")
	if limit {
		if err := ck.switchBeforeDump(cp, t); err != nil {
			return nil, "", nil, err
		}
	}
	p := ck.prepareCapture(ctx, sn, cp)
	err = ck.whileFrozen(cp, dump, limit, t, p.wait)
	lctx, perr := p.wait()
	if err == nil {
		err = perr
	}
	if err != nil {
		cp.Abort(ctx, sn)
		return nil, "", nil, err
	}
	rec, err := cp.Commit(lctx, sn, map[string]string{checkpoint.LabelID: meta.ID})
	if err != nil {
		return nil, "", nil, err
	}
	t.mark("commit")
	return rec, cp.Base(), lctx, nil
}

// whileFrozen freezes the task's cgroup unless the client paused it, dumps it and, once the
// capture's snapshot is prepared (prepared waits for it), writes the capture, then thaws it
// again. A leave-running dump freezes the cgroup itself and leaves it frozen (KeepFrozen: CRIU
// freezes it at its seize when it can, runtime.Container.Checkpoint first otherwise), so the
// task runs on through CRIU's start; "frozen" then counts from the dump's start, an upper bound.
func (ck *checkpointRun) whileFrozen(cp *capture.Capture, dump func() error, limit bool, t *steps, prepared func() (context.Context, error)) (err error) {
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
	if dump != nil {
		if err := dump(); err != nil {
			return err
		}
		t.mark("dump")
		if !ck.opts.Exit && !eng.Paused() {
			// The capture would race with the running task.
			return fmt.Errorf("the task's cgroup was thawed by CRIU's dump: its filesystem cannot be captured consistently")
		}
	}
	if _, err := prepared(); err != nil {
		return err
	}
	t.mark("prepared")
	if err := cp.Walk(); err != nil {
		return err
	}
	t.mark("walk")
	st := cp.Stats()
	t.fields["entries"], t.fields["writes"], t.fields["bytes"], t.fields["delta"] = st.Entries, st.Writes, st.Bytes, st.Delta
	if limit {
		// What the estimate did not see: written while the task was being frozen and dumped,
		// or the previous capture's layer gone. The checkpoint then dumps twice.
		if err := switchRule(st, clientPaused); err != nil {
			return err
		}
	}
	if err := cp.Write(); err != nil {
		return err
	}
	t.mark("write")
	return nil
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
	if ok && g.Bytes <= switchBytes && g.Entries <= switchEntries && (!paused || g.Size <= switchDiffBytes) {
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
	if st.Entries > switchEntries || st.Bytes > switchBytes || clientPaused && st.Size > switchDiffBytes {
		return fmt.Errorf("%w: %d entries, %d bytes changed, %d bytes in all, paused by the client: %t", errSwitch, st.Entries, st.Bytes, st.Size, clientPaused)
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
