package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cklite/cklite/integration/workload"
)

// The tree-search replay (the workload DeltaBox uses for MCTS): from a checkpointed root, each
// expansion mutates the sandbox (the agent counts on in memory and edits its project, the host
// edits a few more files as a tool call would) and checkpoints the new node; before some
// expansions the search jumps back to an earlier node, a rollback, verified against that node's
// memory counter and project hash. The tree is drawn from a seeded generator, so both systems
// and every run replay the same one.
type treeConfig struct {
	seed                            uint64
	expansions, rollbacks, maxDepth int
	agent                           agentKind
	files                           int
}

// hostEdits is how many project files the host rewrites per expansion (plus one it adds).
const hostEdits = 8

// planTree returns parent[k] for nodes 1..expansions (parent[0] is -1, the root): node k is
// expanded from parent[k]. Exactly c.rollbacks expansions start somewhere other than the node
// made just before, no node is deeper than c.maxDepth. Among the trees the seed's generator
// draws, the first that meets both is taken, so the plan depends on the seed alone.
func planTree(c treeConfig) ([]int, error) {
	for attempt := range uint64(1000) {
		rng := rand.New(rand.NewPCG(c.seed, attempt))
		parent, depth := []int{-1}, []int{0}
		cur, rolls := 0, 0
		for k := 1; k <= c.expansions; k++ {
			left := c.expansions - k + 1 // expansions still to make, this one included
			if k > 1 && (depth[cur] == c.maxDepth || rng.IntN(left) < c.rollbacks-rolls) {
				var open []int
				for n := range parent {
					if n != cur && depth[n] < c.maxDepth {
						open = append(open, n)
					}
				}
				cur = open[rng.IntN(len(open))]
				rolls++
			}
			parent, depth = append(parent, cur), append(depth, depth[cur]+1)
			cur = k
		}
		if rolls == c.rollbacks {
			return parent, nil
		}
	}
	return nil, fmt.Errorf("no tree of %d expansions with %d rollbacks and depth <= %d drawn from seed %d", c.expansions, c.rollbacks, c.maxDepth, c.seed)
}

// treeNode is what the replay knows of a checkpointed node, to verify a rollback to it.
type treeNode struct {
	at   workload.Count
	hash string
}

// runTree replays the plan on both systems, taking turns per expansion. The time is split into
// checkpoint, rollback, the agent's and the host's work, and the benchmark's own verification.
func (e *env) runTree(c treeConfig) (_ map[string]*measured, retErr error) {
	parent, err := e.planTreeLogged(c)
	if err != nil {
		return nil, err
	}
	boxes := map[string]sandbox{}
	nodes := map[string][]treeNode{}
	cur := map[string]int{}
	defer func() { retErr = errors.Join(retErr, closeAll(boxes)) }()
	_, res, base, err := e.setUp(series{workload: "tree", agent: c.agent, files: c.files}, boxes)
	if err != nil {
		return nil, err
	}
	for k := 0; k <= c.expansions; k++ {
		for _, sys := range order(k) {
			b, m := boxes[sys], res[sys]
			if k > 0 && cur[sys] != parent[k] {
				if err := e.treeRollback(b, m, parent[k], nodes[sys][parent[k]]); err != nil {
					return nil, fmt.Errorf("%s: node %d: %w", sys, k, err)
				}
			}
			n, err := e.treeExpand(b, m, c, k, nodes[sys])
			if err != nil {
				return nil, fmt.Errorf("%s: node %d: %w", sys, k, err)
			}
			if err := e.afterCheckpoint(b, k, m, base[sys].all); err != nil {
				return nil, fmt.Errorf("%s: after checkpoint %d: %w", sys, k, err)
			}
			nodes[sys], cur[sys] = append(nodes[sys], n), k
		}
		if k%10 == 0 {
			line := fmt.Sprintf("tree: %3d/%d nodes", k, c.expansions)
			for _, sys := range systems {
				line += fmt.Sprintf("   %s C/R %6.1f s", sys, res[sys].overhead().Seconds())
			}
			e.progress("%s", line)
		}
	}
	if err := e.finish(boxes, res, base); err != nil {
		return nil, err
	}
	return res, nil
}

func (e *env) planTreeLogged(c treeConfig) ([]int, error) {
	parent, err := planTree(c)
	if err != nil {
		return nil, err
	}
	depth := 0
	d := make([]int, len(parent))
	for k := 1; k < len(parent); k++ {
		d[k] = d[parent[k]] + 1
		depth = max(depth, d[k])
	}
	e.progress("tree: seed %d, %d expansions, %d rollbacks, depth %d, %s agent, %d project files",
		c.seed, c.expansions, c.rollbacks, depth, c.agent, c.files)
	return parent, nil
}

// treeRollback rolls b back to node i and verifies it: the project as hashed there, the agent's
// counter at exactly its value there, in the same process.
func (e *env) treeRollback(b sandbox, m *measured, i int, n treeNode) error {
	start := time.Now()
	if err := b.rollback(i); err != nil {
		return fmt.Errorf("rollback to node %d: %w", i, err)
	}
	m.rollback = append(m.rollback, time.Since(start))
	m.restores++
	start = time.Now()
	defer func() { m.verify += time.Since(start) }()
	h, err := hashProject(b.rootfs())
	if err != nil {
		return err
	}
	if h != n.hash {
		return fmt.Errorf("after rollback to node %d: the project directory is not as checkpointed", i)
	}
	if _, err := (workload.Counter{Rootfs: b.rootfs()}).WaitFor(e.ctx, fmt.Sprintf("node %d's count %+v", i, n.at),
		func(x workload.Count) bool { return x == n.at }); err != nil {
		return fmt.Errorf("after rollback to node %d: %w", i, err)
	}
	m.verified++
	return nil
}

// treeExpand makes node k: the work (host edits, the agent counts and edits), then the node's
// record, then its checkpoint.
func (e *env) treeExpand(b sandbox, m *measured, c treeConfig, k int, nodes []treeNode) (treeNode, error) {
	start := time.Now()
	if err := editProject(b.rootfs(), c.files, hostEdits, k); err != nil {
		return treeNode{}, err
	}
	at, err := (workload.Counter{Rootfs: b.rootfs()}).Advance(e.ctx, 1)
	if err != nil {
		return treeNode{}, err
	}
	m.work += time.Since(start)
	// Every node's agent is the root's process, restored: its token never changes.
	if len(nodes) > 0 && at.Token != nodes[0].at.Token {
		return treeNode{}, fmt.Errorf("the agent's token is %s, the root's was %s: a restarted process", at.Token, nodes[0].at.Token)
	}
	start = time.Now()
	h, err := hashProject(b.rootfs())
	m.verify += time.Since(start)
	if err != nil {
		return treeNode{}, err
	}
	start = time.Now()
	if err := b.checkpoint(k); err != nil {
		return treeNode{}, fmt.Errorf("checkpoint: %w", err)
	}
	m.checkpoint = append(m.checkpoint, time.Since(start))
	return treeNode{at: at, hash: h}, nil
}

// overhead is the time checkpoints and rollbacks took in all.
func (m *measured) overhead() time.Duration { return sum(m.checkpoint) + sum(m.rollback) }
