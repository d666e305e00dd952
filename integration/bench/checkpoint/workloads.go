package main

import (
	"errors"
	"fmt"
	"slices"
	"time"

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
}

// probed says whether the series' container runs the probe, which measures downtime.
func (s series) probed() bool { return s.agent == busyboxAgent }

// measured is what one system did in one workload.
type measured struct {
	checkpoint, downtime, rollback []time.Duration
	forkEach                       []time.Duration
	forkTotal                      time.Duration
	diskBytes                      int64   // growth of the system's disk dirs over the checkpoints
	diskAfter                      []int64 // the growth after each checkpoint
	fsBytes                        int64   // the growth of filesystem state (see sandbox.fsDisk)
	dedupSaved                     int64   // what dedup of identical files would save, where dedup is set (cklite)
	dedup                          bool
	criu                           []criuStats
	work, verify                   time.Duration // tree search: the agent's and host's work, the benchmark's checks
	shimPeak, snapshotterPeak      uint64        // bytes
	restores, verified             int
}

// allSystems are the systems compared, cklite first.
var allSystems = []string{"cklite", "stock"}

// systems are the ones this run measures: all, unless -systems picks one (set once, before any
// workload runs).
var systems = allSystems

// order is the order the systems take turns in round i: alternating who goes first, so that
// neither always runs right after the other's heavy step (A B B A A B ...).
func order(i int) []string {
	if i%2 == 0 {
		return systems
	}
	r := slices.Clone(systems)
	slices.Reverse(r)
	return r
}

func (e *env) newBox(sys, id string, a agentSpec) (sandbox, error) {
	if sys == "cklite" {
		return e.newCklite(id, a)
	}
	return e.newStock(id, a)
}

// ready waits for a new sandbox's agent to run and returns the token that tells its processes
// from restarted ones: the probe's where it runs, else the agent's counter's.
func (e *env) ready(b sandbox, probed bool) (string, error) {
	if probed {
		return waitProbe(b.rootfs(), "")
	}
	c, err := (workload.Counter{Rootfs: b.rootfs()}).WaitFor(e.ctx, "a first count", func(workload.Count) bool { return true })
	return c.Token, err
}

// runSeries runs one configuration on both systems: k checkpoints, each after the counter moved
// on (and, for the filesystem workload, 1 MB changed), then r rollbacks to checkpoints spread
// over the k, each after a bad action, each verified (the counter at exactly the checkpointed
// value in the same process, the probe the same process, the files as checkpointed).
func (e *env) runSeries(s series, k, r int) (_ map[string]*measured, retErr error) {
	boxes := map[string]sandbox{}
	defer func() { retErr = errors.Join(retErr, closeAll(boxes)) }()
	tokens, res, base, err := e.setUp(s, boxes)
	if err != nil {
		return nil, err
	}
	at := map[string][]workload.Count{}
	hashes := map[string][]string{}
	for i := range k {
		for _, sys := range order(i) {
			b, m := boxes[sys], res[sys]
			if s.rootfsMB > 0 {
				if err := writeDelta(b.rootfs(), i); err != nil {
					return nil, err
				}
			}
			c, err := (workload.Counter{Rootfs: b.rootfs()}).Advance(e.ctx, 2)
			if err != nil {
				return nil, fmt.Errorf("%s: before checkpoint %d: %w", sys, i, err)
			}
			at[sys] = append(at[sys], c)
			h := ""
			if s.files > 0 {
				if h, err = hashProject(b.rootfs()); err != nil {
					return nil, err
				}
			}
			hashes[sys] = append(hashes[sys], h)
			start := time.Now()
			if err := b.checkpoint(i); err != nil {
				return nil, fmt.Errorf("%s: checkpoint %d: %w", sys, i, err)
			}
			took := time.Since(start)
			m.checkpoint = append(m.checkpoint, took)
			down := "-"
			if s.probed() {
				// The probe logs its gap on its first tick after the checkpoint; seeing it tick
				// with its token also shows the checkpoint left the container running, same
				// process.
				if _, err := waitProbe(b.rootfs(), tokens[sys]); err != nil {
					return nil, fmt.Errorf("%s: after checkpoint %d: %w", sys, i, err)
				}
				d, err := downtime(b.rootfs(), start, time.Now())
				if err != nil {
					return nil, err
				}
				m.downtime, down = append(m.downtime, d), fmtMs(d)
			}
			if err := e.afterCheckpoint(b, i, m, base[sys].all); err != nil {
				return nil, fmt.Errorf("%s: after checkpoint %d: %w", sys, i, err)
			}
			cs := m.criu[len(m.criu)-1]
			e.progress("%-6s checkpoint %d/%d %8s   downtime %8s   CRIU frozen %s", sys, i+1, k, fmtMs(took), down, fmtMs(cs.frozen))
		}
	}
	if err := e.finish(boxes, res, base); err != nil {
		return nil, err
	}

	for j := range r {
		i := (j * 3) % k // spread over the checkpoints, not always the last
		for _, sys := range order(j) {
			b, m := boxes[sys], res[sys]
			if err := badAction(b.rootfs()); err != nil {
				return nil, err
			}
			start := time.Now()
			if err := b.rollback(i); err != nil {
				return nil, fmt.Errorf("%s: rollback to checkpoint %d: %w", sys, i, err)
			}
			took := time.Since(start)
			m.rollback = append(m.rollback, took)
			m.restores++
			if err := e.verify(b.rootfs(), at[sys][i], hashes[sys][i], tokens[sys], s, i); err != nil {
				return nil, fmt.Errorf("%s: after rollback to checkpoint %d: %w", sys, i, err)
			}
			m.verified++
			m.shimPeak = max(m.shimPeak, e.shimPeak(b.id()))
			e.progress("%-6s rollback to %d   %8s   verified", sys, i+1, fmtMs(took))
		}
	}
	return res, nil
}

// setUp starts series s's container on every system into boxes (which the caller closes, also
// after an error), writes its project and data, and returns each agent's token, a fresh
// measured per system and the disk use before the first checkpoint.
func (e *env) setUp(s series, boxes map[string]sandbox) (map[string]string, map[string]*measured, map[string]diskBase, error) {
	tokens, res := map[string]string{}, map[string]*measured{}
	for _, sys := range systems {
		b, err := e.newBox(sys, fmt.Sprintf("%s-%s-%d-%d", sys, s.workload, s.memMB, s.rootfsMB), agentSpec{kind: s.agent, memMB: s.memMB})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%s: starting the container: %w", sys, err)
		}
		boxes[sys] = b
		res[sys] = &measured{}
		if tokens[sys], err = e.ready(b, s.probed()); err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w", sys, err)
		}
		if s.files > 0 {
			e.progress("%s: writing a project of %d files", sys, s.files)
			if err := writeProject(b.rootfs(), s.files); err != nil {
				return nil, nil, nil, fmt.Errorf("%s: %w", sys, err)
			}
		}
		if s.rootfsMB > 0 {
			e.progress("%s: writing %d MB to the rootfs", sys, s.rootfsMB)
			if err := writeData(b.rootfs(), s.rootfsMB); err != nil {
				return nil, nil, nil, fmt.Errorf("%s: %w", sys, err)
			}
		}
	}
	base, err := diskBases(boxes)
	if err != nil {
		return nil, nil, nil, err
	}
	e.resetSnapshotterPeak()
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
func (e *env) finish(boxes map[string]sandbox, res map[string]*measured, base map[string]diskBase) error {
	for sys, b := range boxes {
		m := res[sys]
		m.diskBytes = m.diskAfter[len(m.diskAfter)-1]
		fs, err := b.fsDisk()
		if err != nil {
			return err
		}
		m.fsBytes = fs - base[sys].fs
		if sys == "cklite" { // stock's overlayfs snapshotter runs inside containerd, without dedup
			m.snapshotterPeak = e.snapshotterPeak()
			if m.dedupSaved, err = dedupSavings(b.diskDirs()[0]); err != nil {
				return err
			}
			m.dedup = true
		}
	}
	return nil
}

// afterCheckpoint records what checkpoint i of b left behind: CRIU's stats, the disk grown
// since before the first checkpoint, the shim's peak memory.
func (e *env) afterCheckpoint(b sandbox, i int, m *measured, diskBefore int64) error {
	work, err := e.workDir(b.id(), i)
	if err != nil {
		return err
	}
	cs, err := readCRIUStats(work)
	if err != nil {
		return fmt.Errorf("CRIU stats: %w", err)
	}
	du, err := diskUsage(b.diskDirs()...)
	if err != nil {
		return err
	}
	m.criu, m.diskAfter = append(m.criu, cs), append(m.diskAfter, du-diskBefore)
	m.shimPeak = max(m.shimPeak, e.shimPeak(b.id()))
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
	if s.probed() {
		if _, err := waitProbe(rootfs, token); err != nil {
			return err
		}
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
// same processes) and removed before the next n.
func (e *env) runFanout(ns []int) (_ map[int]map[string]*measured, retErr error) {
	res := map[int]map[string]*measured{}
	boxes := map[string]sandbox{}
	at := map[string]workload.Count{}
	tokens := map[string]string{}
	defer func() { retErr = errors.Join(retErr, closeAll(boxes)) }()
	for _, sys := range systems {
		b, err := e.newBox(sys, sys+"-fanout", agentSpec{kind: busyboxAgent, slow: true})
		if err != nil {
			return nil, fmt.Errorf("%s: starting the container: %w", sys, err)
		}
		boxes[sys] = b
		if tokens[sys], err = waitProbe(b.rootfs(), ""); err != nil {
			return nil, err
		}
		if at[sys], err = (workload.Counter{Rootfs: b.rootfs()}).Advance(e.ctx, 2); err != nil {
			return nil, err
		}
		if err := b.checkpoint(0); err != nil {
			return nil, fmt.Errorf("%s: checkpoint: %w", sys, err)
		}
	}
	for round, n := range ns {
		res[n] = map[string]*measured{}
		for _, sys := range order(round) {
			m := &measured{}
			res[n][sys] = m
			prefix := fmt.Sprintf("%s-fork%d", sys, n)
			before, err := diskUsage(boxes[sys].diskDirs()...)
			if err != nil {
				return nil, err
			}
			start := time.Now()
			ids, each, err := boxes[sys].fork(0, n, prefix)
			m.forkTotal = time.Since(start)
			// Forks are removed whatever happened, so that a failure leaves nothing running.
			defer func(ids []string) {
				for _, id := range ids {
					retErr = errors.Join(retErr, e.remove(id))
				}
			}(ids)
			if err != nil {
				return nil, fmt.Errorf("%s: fork -n %d: %w", sys, n, err)
			}
			m.forkEach = each
			// What the forks themselves occupy, right after they started: each has written no more
			// than its counter's few bytes yet.
			after, err := diskUsage(boxes[sys].diskDirs()...)
			if err != nil {
				return nil, err
			}
			m.diskBytes = (after - before) / int64(n)
			for _, id := range ids {
				m.restores++
				rootfs := e.d.RootfsPath(id)
				if err := (workload.Counter{Rootfs: rootfs}).ExpectRestored(e.ctx, at[sys]); err != nil {
					return nil, fmt.Errorf("%s: fork %s: %w", sys, id, err)
				}
				if _, err := waitProbe(rootfs, tokens[sys]); err != nil {
					return nil, fmt.Errorf("%s: fork %s: %w", sys, id, err)
				}
				m.verified++
				m.shimPeak = max(m.shimPeak, e.shimPeak(id))
			}
			for _, id := range ids {
				if err := e.remove(id); err != nil {
					return nil, err
				}
			}
			e.progress("%-6s fork -n %-3d total %8s   each p50 %6.0f ms   %d/%d verified", sys, n, fmtMs(m.forkTotal), percentile(each, 0.5), m.verified, m.restores)
		}
	}
	return res, nil
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
