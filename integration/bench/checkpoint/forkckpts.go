package main

import (
	"errors"
	"fmt"

	"github.com/cklite/cklite/integration/workload"
)

// The forks' checkpoints (issue 19): one agent checkpointed once, the origin, forked n times;
// each fork then works and checkpoints k times, as RL rollouts from one state do. What it
// measures is whether the forks' checkpoints share the origin's memory: a fork's lineage leads to
// the checkpoint it was forked from, so its first checkpoint is stored against the origin's
// images and each later one against the fork's previous. cklite only: stock keeps a full dump a
// checkpoint, n x k of them, which the memory and agent workloads already show.
type forkedConfig struct {
	forks, checkpoints int // forks 0: left out
	agent              agentSpec
}

// forkedParam names the workload in the table.
func forkedParam(c forkedConfig) string {
	return fmt.Sprintf("%d forks x %d ckpts, python %d MB", c.forks, c.checkpoints, c.agent.memMB)
}

// runForked runs the workload on cklite: the origin's checkpoint, the forks (each verified: the
// counter as checkpointed, in the same process), then each fork's checkpoints in turn and one
// rollback of each fork to its middle checkpoint, verified. The disk is what the forks and their
// checkpoints added to the origin's checkpoint, measured once the memory store is done.
func (e *env) runForked(c forkedConfig) (_ *measured, retErr error) {
	const sys = "cklite"
	w := where{"fork checkpoints", forkedParam(c)}
	m := &measured{}
	boxes := map[string]sandbox{}
	defer func() { retErr = errors.Join(retErr, closeAll(boxes)) }()
	var origin sandbox
	var at workload.Count
	var token string
	_, err := e.op(w, sys, "starting and checkpointing the origin", func() (err error) {
		if origin, err = e.systems[sys].start(sys+"-forked", c.agent); err != nil {
			return err
		}
		boxes[sys] = origin
		if token, err = waitProbe(origin.rootfs(), ""); err != nil {
			return err
		}
		if at, err = (workload.Counter{Rootfs: origin.rootfs()}).Advance(e.ctx, 2); err != nil {
			return err
		}
		if err := origin.checkpoint(0); err != nil {
			return err
		}
		return settled(origin, 0)
	})
	if err != nil {
		return m, nil
	}
	base, err := diskBases(boxes)
	if err != nil {
		return nil, err
	}
	var forks []sandbox
	defer func() { retErr = errors.Join(retErr, closeForks(forks)) }()
	took, err := e.op(w, sys, fmt.Sprintf("fork -n %d", c.forks), func() (err error) {
		forks, m.forkEach, err = origin.fork(0, c.forks, sys+"-forked-f")
		return err
	})
	if err != nil {
		return m, nil
	}
	m.forkTotal = took
	for _, f := range forks {
		m.restores++
		if _, err := e.op(w, sys, "verifying fork "+f.id(), func() error {
			return (workload.Counter{Rootfs: f.rootfs()}).ExpectRestored(e.ctx, at)
		}); err == nil {
			m.verified++
		}
	}
	originID := checkpointID(origin, 0)
	for j, f := range forks {
		if err := e.ctx.Err(); err != nil {
			return nil, err
		}
		counts := e.forkCheckpoints(w, f, m, c.checkpoints, at.Token, base[sys].all)
		if against, err := storedAgainst(f, 0); err == nil && against == originID && originID != "" {
			m.fromOrigin++
		}
		if i := c.checkpoints / 2; len(counts) > i {
			e.forkRollback(w, f, m, i, counts[i], token)
		}
		e.progress("%-6s fork %d/%d: %d checkpoints", sys, j+1, len(forks), len(counts))
	}
	m.diskBytes = m.lastDisk()
	_, _ = e.op(w, sys, "measuring the disk", func() error {
		fs, err := origin.fsDisk()
		if err != nil {
			return err
		}
		m.fsBytes = fs - base[sys].fs
		for _, f := range forks {
			l, s, err := memoryOf(f)
			if err != nil {
				return err
			}
			m.memLogical, m.memStored = m.memLogical+l, m.memStored+s
		}
		return nil
	})
	return m, e.ctx.Err()
}

// forkCheckpoints takes k checkpoints of fork f, the agent counting (and changing its memory)
// before each, the origin's agent (its counter's token agent), and returns the counts they hold, by checkpoint, up to the first failure.
func (e *env) forkCheckpoints(w where, f sandbox, m *measured, k int, agent string, diskBefore int64) []workload.Count {
	var counts []workload.Count
	for i := range k {
		var c workload.Count
		_, err := e.op(w, "cklite", fmt.Sprintf("%s: before checkpoint %d", f.id(), i), func() (err error) {
			c, err = (workload.Counter{Rootfs: f.rootfs()}).Advance(e.ctx, 2)
			if err == nil && c.Token != agent {
				err = fmt.Errorf("the agent's token is %s, the origin's was %s: a restarted process", c.Token, agent)
			}
			return err
		})
		if err != nil {
			return counts
		}
		took, err := e.op(w, "cklite", fmt.Sprintf("%s: checkpoint %d", f.id(), i), func() error { return f.checkpoint(i) })
		if err != nil {
			return counts
		}
		m.checkpoint = append(m.checkpoint, took)
		if _, err := e.op(w, "cklite", fmt.Sprintf("%s: measuring checkpoint %d", f.id(), i), func() error {
			return e.afterCheckpoint(f, i, m, diskBefore)
		}); err != nil {
			return counts
		}
		counts = append(counts, c)
	}
	return counts
}

// forkRollback rolls fork f back to its checkpoint i and verifies it: the counter at exactly the
// checkpointed value, counting on, and the probe the origin's (token).
func (e *env) forkRollback(w where, f sandbox, m *measured, i int, at workload.Count, token string) {
	step := fmt.Sprintf("%s: rollback to checkpoint %d", f.id(), i)
	if _, err := e.op(w, "cklite", "bad action before "+step, func() error { return badAction(f.rootfs()) }); err != nil {
		return
	}
	took, err := e.op(w, "cklite", step, func() error { return f.rollback(i) })
	if err != nil {
		return
	}
	m.rollback = append(m.rollback, took)
	m.restores++
	if _, err := e.op(w, "cklite", "verifying "+step, func() error {
		if err := (workload.Counter{Rootfs: f.rootfs()}).ExpectRestored(e.ctx, at); err != nil {
			return err
		}
		if _, err := waitProbe(f.rootfs(), token); err != nil {
			return err
		}
		return checkPasswd(f.rootfs())
	}); err == nil {
		m.verified++
	}
}

// lastDisk is the disk grown after the last checkpoint measured, 0 before any.
func (m *measured) lastDisk() int64 {
	if len(m.diskAfter) == 0 {
		return 0
	}
	return m.diskAfter[len(m.diskAfter)-1]
}
