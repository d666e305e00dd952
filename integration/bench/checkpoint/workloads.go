package main

import (
	"errors"
	"fmt"
	"iter"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/integration/workload"
)

// series is one configuration of the checkpoint/rollback workloads: idle, memory, filesystem or
// agent sandbox.
type series struct {
	workload string // "idle", "memory", "filesystem", "agent"
	param    string // what the table shows next to it
	agent    agentKind
	memMB    int // memory the probe (busybox) or the agent (python) holds
	rootfsMB int // data written to the rootfs before the first checkpoint
	files    int // files of the project directory written before the first checkpoint
	churnKB  int // memory the agent rewrites per count (python; agentSpec.churnKB)
	// ckpts is how many checkpoints the series takes; 0: the run's -checkpoints.
	ckpts int
	// ckliteOnly leaves stock out: the agent's history of 100 checkpoints would be 100 full
	// dumps there (25 GiB at 256 MB), which the memory workload's 8 already show.
	ckliteOnly bool
}

// checkpoints is how many checkpoints s takes in a run of k a series.
func (s series) checkpoints(k int) int {
	if s.ckpts > 0 {
		return s.ckpts
	}
	return k
}

// runsOn says whether series s runs on system sys.
func (s series) runsOn(sys string) bool { return !s.ckliteOnly || sys == "cklite" }

// measured is what one system did in one workload.
type measured struct {
	checkpoint, downtime, rollback []time.Duration
	forkEach                       []time.Duration
	exec, ckptExecs                []time.Duration // the exec workload: short execs, checkpoints with exec'd processes
	forkTotal                      time.Duration
	diskBytes                      int64   // growth of the system's disk dirs over the checkpoints
	diskAfter                      []int64 // the growth after each checkpoint
	fsBytes                        int64   // the growth of filesystem state (see sandbox.fsDisk)
	dedupSaved                     int64   // what dedup of identical files would save, where dedup is set (cklite)
	memLogical, memStored          int64   // the checkpoints' memory as dumped and as stored (memoryStore)
	exportImage, exportPushed      int64   // the last checkpoint's image, and what of it the one before's lacks (exportSharer)
	dedup                          bool
	criu                           []criuStats
	work, verify                   time.Duration // tree search: the agent's and host's work, the benchmark's checks
	shimPeak, snapshotterPeak      uint64        // bytes
	restores, verified             int
	fromOrigin                     int // fork checkpoints: forks whose first checkpoint is stored against the origin
}

// allSystems are the systems compared, cklite first.
var allSystems = []string{"cklite", "stock"}

// systems are the ones this run measures: all, unless -systems picks one (set once, before any
// workload runs).
var systems = allSystems

// turns yields the systems in the order they take turns in round i: alternating who goes first,
// so that neither always runs right after the other's heavy step (A B B A A B ...). With both
// systems measured, each turn begins with a sync, outside any timing: the writeback of what the
// other system wrote in its turn (stock's rw diffs and checkpoint archives, hundreds of MB in the
// filesystem workload) was otherwise paid by the next system's operation, whichever it was.
func turns(i int) iter.Seq[string] {
	order := systems
	if i%2 == 1 {
		order = slices.Clone(systems)
		slices.Reverse(order)
	}
	return func(yield func(string) bool) {
		for _, sys := range order {
			if len(systems) > 1 {
				unix.Sync()
			}
			if !yield(sys) {
				return
			}
		}
	}
}

// ready waits for a new sandbox's agent to run and returns the token of its probe, which tells
// its processes from restarted ones. Every agent runs the probe, which also measures downtime: the
// busybox agent next to its shell, the python agent in a thread of its own (pyAgent).
func (e *env) ready(b sandbox) (string, error) {
	return waitProbe(b.rootfs(), "")
}

// runSeries runs one configuration on both systems: k checkpoints, each after the counter moved
// on (and, for the filesystem workload, 1 MB changed), then r rollbacks to checkpoints spread
// over the k, each after a bad action, each verified (the counter at exactly the checkpointed
// value in the same process, the probe the same process, the files as checkpointed). A system's
// failed operation is recorded and skipped: its rollbacks go to the checkpoints it did take.
func (e *env) runSeries(s series, k, r int) (_ map[string]*measured, retErr error) {
	w := where{s.workload, s.param}
	boxes := map[string]sandbox{}
	defer func() { retErr = errors.Join(retErr, closeAll(boxes)) }()
	tokens, res, base, err := e.setUp(w, s, boxes)
	if err != nil {
		return nil, err
	}
	// What each system's checkpoints held, by checkpoint: only those taken.
	at := map[string]map[int]workload.Count{}
	hashes := map[string]map[int]string{}
	for sys := range boxes {
		at[sys], hashes[sys] = map[int]workload.Count{}, map[int]string{}
	}
	for i := range k {
		if err := e.ctx.Err(); err != nil {
			return nil, err
		}
		for sys := range turns(i) {
			if boxes[sys] == nil {
				continue
			}
			c, h, err := e.seriesCheckpoint(w, s, sys, boxes[sys], res[sys], i, k, tokens[sys], base[sys].all)
			if err == nil {
				at[sys][i], hashes[sys][i] = c, h
			}
		}
	}
	if err := e.finish(w, boxes, res, base); err != nil {
		return nil, err
	}

	for j := range r {
		if err := e.ctx.Err(); err != nil {
			return nil, err
		}
		for sys := range turns(j) {
			taken := sortedKeys(at[sys])
			if len(taken) == 0 {
				continue
			}
			i := rollbackTarget(taken, j, r)
			e.seriesRollback(w, s, sys, boxes[sys], res[sys], i, at[sys][i], hashes[sys][i], tokens[sys])
		}
	}
	return res, nil
}

// rollbackTarget is the checkpoint, of those taken, that rollback j of r goes to: spread over
// the checkpoints, not always the last; over a long history (more than 3 a rollback) evenly from
// the last one back, so that the deepest chains of the memory store are restored too.
func rollbackTarget(taken []int, j, r int) int {
	if len(taken) > 3*r {
		return taken[len(taken)-1-j*(len(taken)/r)]
	}
	return taken[(j*3)%len(taken)]
}

// seriesCheckpoint takes checkpoint i of k of series s on system sys and returns the counter and
// project hash it holds; an error is recorded already.
func (e *env) seriesCheckpoint(w where, s series, sys string, b sandbox, m *measured, i, k int, token string, diskBefore int64) (workload.Count, string, error) {
	var c workload.Count
	var h string
	step := fmt.Sprintf("checkpoint %d", i)
	_, err := e.op(w, sys, "before "+step, func() (err error) {
		if s.rootfsMB > 0 {
			if err := writeDelta(b.rootfs(), i); err != nil {
				return err
			}
		}
		if c, err = (workload.Counter{Rootfs: b.rootfs()}).Advance(e.ctx, 2); err != nil {
			return err
		}
		if s.files > 0 {
			h, err = hashProject(b.rootfs())
		}
		return err
	})
	if err != nil {
		return c, h, err
	}
	start := time.Now()
	took, err := e.op(w, sys, step, func() error { return b.checkpoint(i) })
	if err != nil {
		return c, h, err
	}
	m.checkpoint = append(m.checkpoint, took)
	down := "-"
	// The probe logs its gap on its first tick after the checkpoint; seeing it tick with its
	// token also shows the checkpoint left the container running, same process.
	_, err = e.op(w, sys, "probe after "+step, func() error {
		if _, err := waitProbe(b.rootfs(), token); err != nil {
			return err
		}
		d, err := downtime(b.rootfs(), start, time.Now())
		if err == nil {
			m.downtime, down = append(m.downtime, d), fmtMs(d)
		}
		return err
	})
	if err != nil {
		return c, h, err
	}
	if _, err := e.op(w, sys, "measuring "+step, func() error { return e.afterCheckpoint(b, i, m, diskBefore) }); err != nil {
		// The checkpoint was taken: rollbacks may go to it.
		return c, h, nil
	}
	cs := m.criu[len(m.criu)-1]
	e.progress("%-6s checkpoint %d/%d %8s   downtime %8s   CRIU frozen %s", sys, i+1, k, fmtMs(took), down, fmtMs(cs.frozen))
	return c, h, nil
}

// seriesRollback makes the bad action, rolls b back to checkpoint i and verifies it; an error is
// recorded.
func (e *env) seriesRollback(w where, s series, sys string, b sandbox, m *measured, i int, at workload.Count, hash, token string) {
	step := fmt.Sprintf("rollback to checkpoint %d", i)
	if _, err := e.op(w, sys, "bad action before "+step, func() error { return badAction(b.rootfs()) }); err != nil {
		return
	}
	took, err := e.op(w, sys, step, func() error { return b.rollback(i) })
	if err != nil {
		return
	}
	m.rollback = append(m.rollback, took)
	m.restores++
	if _, err := e.op(w, sys, "verifying "+step, func() error { return e.verify(b.rootfs(), at, hash, token, s, i) }); err != nil {
		return
	}
	m.verified++
	m.shimPeak = max(m.shimPeak, b.shimPeak())
	e.progress("%-6s rollback to %d   %8s   verified", sys, i+1, fmtMs(took))
}

// setUp starts series s's container on every system into boxes (which the caller closes, also
// after an error), writes its project and data, and returns each agent's token, a fresh
// measured per system and the disk use before the first checkpoint. A system that fails to set
// up is recorded and left out of boxes.
func (e *env) setUp(w where, s series, boxes map[string]sandbox) (map[string]string, map[string]*measured, map[string]diskBase, error) {
	tokens, res := map[string]string{}, map[string]*measured{}
	for _, sys := range systems {
		if !s.runsOn(sys) {
			continue
		}
		res[sys] = &measured{}
		var b sandbox
		_, err := e.op(w, sys, "starting the container", func() (err error) {
			b, err = e.systems[sys].start(fmt.Sprintf("%s-%s-%d-%d", sys, s.workload, s.memMB, s.rootfsMB), agentSpec{kind: s.agent, memMB: s.memMB, churnKB: s.churnKB})
			return err
		})
		if err != nil {
			continue
		}
		boxes[sys] = b
		_, err = e.op(w, sys, "preparing the container", func() (err error) {
			if tokens[sys], err = e.ready(b); err != nil {
				return err
			}
			if s.files > 0 {
				e.progress("%s: writing a project of %d files", sys, s.files)
				if err := writeProject(b.rootfs(), s.files); err != nil {
					return err
				}
			}
			if s.rootfsMB > 0 {
				e.progress("%s: writing %d MB to the rootfs", sys, s.rootfsMB)
				return writeData(b.rootfs(), s.rootfsMB)
			}
			return nil
		})
		if err != nil {
			delete(boxes, sys)
			if err := b.close(); err != nil {
				e.progress("%s: cleaning up: %v", sys, err)
			}
		}
	}
	if err := e.ctx.Err(); err != nil {
		return nil, nil, nil, err
	}
	base, err := diskBases(boxes)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, sys := range systems {
		e.systems[sys].resetPeak()
	}
	return tokens, res, base, nil
}

// diskBase is a sandbox's disk use before its first checkpoint: in all, and of filesystem state.
type diskBase struct{ all, fs int64 }

func diskBases(boxes map[string]sandbox) (map[string]diskBase, error) {
	base := map[string]diskBase{}
	for sys, b := range boxes {
		all, err := diskUsage(b.diskDirs()...)
		if err != nil {
			return nil, err
		}
		fs, err := b.fsDisk()
		if err != nil {
			return nil, err
		}
		base[sys] = diskBase{all, fs}
	}
	return base, nil
}

// finish records what a workload's checkpoints left at its end: the disk they took in all, of
// filesystem state, and what dedup would save of cklite's; cklite-snapshotter's peak memory.
func (e *env) finish(w where, boxes map[string]sandbox, res map[string]*measured, base map[string]diskBase) error {
	for sys, b := range boxes {
		m := res[sys]
		if len(m.diskAfter) > 0 {
			m.diskBytes = m.diskAfter[len(m.diskAfter)-1]
		}
		_, _ = e.op(w, sys, "measuring the disk", func() error {
			fs, err := b.fsDisk()
			if err != nil {
				return err
			}
			m.fsBytes = fs - base[sys].fs
			if m.memLogical, m.memStored, err = memoryOf(b); err != nil {
				return err
			}
			if sys != "cklite" { // stock's overlayfs snapshotter runs inside containerd, without dedup
				return nil
			}
			m.snapshotterPeak = e.systems[sys].peak()
			m.dedupSaved, err = dedupSavings(b.diskDirs()[0])
			m.dedup = err == nil
			return err
		})
		// Last: the export's content is not the checkpoints' disk.
		_, _ = e.op(w, sys, "exporting the last two checkpoints", func() (err error) {
			m.exportImage, m.exportPushed, err = exportShareOf(b)
			return err
		})
	}
	return e.ctx.Err()
}

// afterCheckpoint records what checkpoint i of b left behind: CRIU's stats, the disk grown
// since before the first checkpoint (once a memoryStore is done with it), the shim's peak memory.
func (e *env) afterCheckpoint(b sandbox, i int, m *measured, diskBefore int64) error {
	if err := settled(b, i); err != nil {
		return err
	}
	cs, err := b.criu(i)
	if err != nil {
		return fmt.Errorf("CRIU stats: %w", err)
	}
	du, err := diskUsage(b.diskDirs()...)
	if err != nil {
		return err
	}
	m.criu, m.diskAfter = append(m.criu, cs), append(m.diskAfter, du-diskBefore)
	m.shimPeak = max(m.shimPeak, b.shimPeak())
	return nil
}

// verify checks the container whose rootfs is rootfs holds checkpoint i of series s: the counter
// at exactly `at` in the same process and counting on, the probe the process it was (token), the
// image's files undamaged, the project as hashed at the checkpoint (hash) and, in the filesystem
// workload, the data and checkpoint i's 1 MB.
func (e *env) verify(rootfs string, at workload.Count, hash, token string, s series, i int) error {
	// The hash first: the counter's check lets the agent count on, and edit the project.
	if s.files > 0 {
		got, err := hashProject(rootfs)
		if err != nil {
			return err
		}
		if got != hash {
			return fmt.Errorf("the project directory is not as at checkpoint %d", i)
		}
	}
	if err := (workload.Counter{Rootfs: rootfs}).ExpectRestored(e.ctx, at); err != nil {
		return err
	}
	if _, err := waitProbe(rootfs, token); err != nil {
		return err
	}
	if err := checkPasswd(rootfs); err != nil {
		return err
	}
	if s.rootfsMB == 0 {
		return nil
	}
	if err := checkData(rootfs, s.rootfsMB); err != nil {
		return err
	}
	return checkDelta(rootfs, i)
}

// runFanout checkpoints an idle container on each system once and forks it n times for each n,
// while it runs on. Each fork is verified (the counter and the probe as checkpointed, in the
// same processes) and removed before the next n. A system whose container or checkpoint failed
// is left out; a failed fork -n is recorded and the next n runs.
func (e *env) runFanout(ns []int) (_ map[int]map[string]*measured, retErr error) {
	res := map[int]map[string]*measured{}
	boxes := map[string]sandbox{}
	at := map[string]workload.Count{}
	tokens := map[string]string{}
	defer func() { retErr = errors.Join(retErr, closeAll(boxes)) }()
	setup := where{"fan-out", "the checkpoint forked"}
	for _, sys := range systems {
		var b sandbox
		_, err := e.op(setup, sys, "starting the container", func() (err error) {
			b, err = e.systems[sys].start(sys+"-fanout", agentSpec{kind: busyboxAgent, slow: true})
			return err
		})
		if err != nil {
			continue
		}
		boxes[sys] = b
		_, err = e.op(setup, sys, "checkpoint", func() (err error) {
			if tokens[sys], err = waitProbe(b.rootfs(), ""); err != nil {
				return err
			}
			if at[sys], err = (workload.Counter{Rootfs: b.rootfs()}).Advance(e.ctx, 2); err != nil {
				return err
			}
			if err := b.checkpoint(0); err != nil {
				return err
			}
			return settled(b, 0) // no rewrite of its images under the forks' disk measurement
		})
		if err != nil {
			delete(boxes, sys)
			if err := b.close(); err != nil {
				e.progress("%s: cleaning up: %v", sys, err)
			}
		}
	}
	for round, n := range ns {
		if err := e.ctx.Err(); err != nil {
			return nil, err
		}
		res[n] = map[string]*measured{}
		for sys := range turns(round) {
			if boxes[sys] == nil {
				continue
			}
			m := &measured{}
			res[n][sys] = m
			e.forkN(where{"fan-out", fmt.Sprintf("%d forks", n)}, sys, boxes[sys], m, n, at[sys], tokens[sys])
		}
	}
	return res, e.ctx.Err()
}

// forkN forks checkpoint 0 of b n times into m, verifies each fork and removes them all; an
// error is recorded.
func (e *env) forkN(w where, sys string, b sandbox, m *measured, n int, at workload.Count, token string) {
	before, err := diskUsage(b.diskDirs()...)
	if err != nil {
		_, _ = e.op(w, sys, "measuring the disk", func() error { return err })
		return
	}
	var forks []sandbox
	var each []time.Duration
	took, err := e.op(w, sys, fmt.Sprintf("fork -n %d", n), func() (err error) {
		forks, each, err = b.fork(0, n, fmt.Sprintf("%s-fork%d", sys, n))
		return err
	})
	// Forks are removed whatever happened, so that a failure leaves nothing running.
	defer func() {
		if err := closeForks(forks); err != nil {
			_, _ = e.op(w, sys, "removing the forks", func() error { return err })
		}
	}()
	if err != nil {
		return
	}
	m.forkTotal, m.forkEach = took, each
	// What the forks themselves occupy, right after they started: each has written no more than
	// its counter's few bytes yet.
	if after, err := diskUsage(b.diskDirs()...); err == nil {
		m.diskBytes = (after - before) / int64(n)
	}
	for _, f := range forks {
		m.restores++
		_, err := e.op(w, sys, "verifying fork "+f.id(), func() error {
			if err := (workload.Counter{Rootfs: f.rootfs()}).ExpectRestored(e.ctx, at); err != nil {
				return err
			}
			_, err := waitProbe(f.rootfs(), token)
			return err
		})
		if err == nil {
			m.verified++
		}
		m.shimPeak = max(m.shimPeak, f.shimPeak())
	}
	e.progress("%-6s fork -n %-3d total %8s   each p50 %6.0f ms   %d/%d verified", sys, n, fmtMs(m.forkTotal), percentile(each, 0.5), m.verified, m.restores)
}

// closeAll closes every system's sandbox that was started.
func closeAll(boxes map[string]sandbox) error {
	var errs []error
	for _, sys := range systems {
		if b := boxes[sys]; b != nil {
			if err := b.close(); err != nil {
				errs = append(errs, fmt.Errorf("%s: cleaning up: %w", sys, err))
			}
		}
	}
	return errors.Join(errs...)
}

func fmtMs(d time.Duration) string { return fmt.Sprintf("%.0f ms", msOf(d)) }
