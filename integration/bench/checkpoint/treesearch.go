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
//
// A failed operation is recorded and the system's replay goes on from the last good node: a
// node whose expansion failed has no checkpoint, so its children are expanded from its nearest
// checkpointed ancestor, and after any failure the next node starts with a rollback. A system
// whose root checkpoint failed has nothing to roll back to; its replay ends there.
func (e *env) runTree(c treeConfig) (_ map[string]*measured, retErr error) {
	parent, err := e.planTreeLogged(c)
	if err != nil {
		return nil, err
	}
	w := where{"tree search", treeParam(c)}
	boxes := map[string]sandbox{}
	nodes := map[string][]*treeNode{} // by node; nil where the system has no checkpoint of it
	cur := map[string]int{}           // the node the container is at; -1 when unknown after a failure
	defer func() { retErr = errors.Join(retErr, closeAll(boxes)) }()
	_, res, base, err := e.setUp(w, series{workload: "tree", agent: c.agent, files: c.files}, boxes)
	if err != nil {
		return nil, err
	}
	for k := 0; k <= c.expansions; k++ {
		if err := e.ctx.Err(); err != nil {
			return nil, err
		}
		for sys := range turns(k) {
			if boxes[sys] == nil {
				continue
			}
			n, at := e.treeStep(w, sys, boxes[sys], res[sys], c, parent, k, nodes[sys], cur[sys], base[sys].all)
			nodes[sys], cur[sys] = append(nodes[sys], n), at
			if k == 0 && n == nil {
				e.progress("%-6s tree search ends: its root has no checkpoint to go back to", sys)
				b := boxes[sys]
				delete(boxes, sys)
				_, _ = e.op(w, sys, "removing the container", b.close)
			}
		}
		if k%10 == 0 {
			line := fmt.Sprintf("tree: %3d/%d nodes", k, c.expansions)
			for _, sys := range systems {
				line += fmt.Sprintf("   %s C/R %6.1f s", sys, res[sys].overhead().Seconds())
			}
			e.progress("%s", line)
		}
	}
	if err := e.finish(w, boxes, res, base); err != nil {
		return nil, err
	}
	return res, nil
}

// treeParam names the tree search in the table.
func treeParam(c treeConfig) string {
	return fmt.Sprintf("%d nodes, %d rollbacks", c.expansions+1, c.rollbacks)
}

// treeStep makes node k on one system: a rollback to the node it is expanded from, unless the
// container is there, then the expansion. It returns the node (nil when it failed, recorded) and
// the node the container is at afterwards (-1: unknown).
func (e *env) treeStep(w where, sys string, b sandbox, m *measured, c treeConfig, parent []int, k int, nodes []*treeNode, cur int, diskBefore int64) (*treeNode, int) {
	from := -1
	if k > 0 {
		from = parent[k]
		for from >= 0 && nodes[from] == nil {
			from = parent[from]
		}
		if from < 0 {
			return nil, -1
		}
		if cur != from {
			if err := e.treeRollback(w, sys, b, m, from, *nodes[from]); err != nil {
				return nil, -1
			}
		}
	}
	token := ""
	if k > 0 {
		token = nodes[0].at.Token
	}
	n, err := e.treeExpand(w, sys, b, m, c, k, token)
	if err != nil {
		return nil, -1
	}
	_, _ = e.op(w, sys, fmt.Sprintf("measuring node %d", k), func() error { return e.afterCheckpoint(b, k, m, diskBefore) })
	return &n, k
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
func (e *env) treeRollback(w where, sys string, b sandbox, m *measured, i int, n treeNode) error {
	step := fmt.Sprintf("rollback to node %d", i)
	took, err := e.op(w, sys, step, func() error { return b.rollback(i) })
	if err != nil {
		return err
	}
	m.rollback = append(m.rollback, took)
	m.restores++
	start := time.Now()
	defer func() { m.verify += time.Since(start) }()
	_, err = e.op(w, sys, "verifying "+step, func() error {
		h, err := hashProject(b.rootfs())
		if err != nil {
			return err
		}
		if h != n.hash {
			return errors.New("the project directory is not as checkpointed")
		}
		_, err = (workload.Counter{Rootfs: b.rootfs()}).WaitFor(e.ctx, fmt.Sprintf("node %d's count %+v", i, n.at),
			func(x workload.Count) bool { return x == n.at })
		return err
	})
	if err != nil {
		return err
	}
	m.verified++
	return nil
}

// treeExpand makes node k: the work (host edits, the agent counts and edits), then the node's
// record, then its checkpoint. token is the root's agent's ("" for the root itself): every
// node's agent is the root's process, restored, so its token never changes.
func (e *env) treeExpand(w where, sys string, b sandbox, m *measured, c treeConfig, k int, token string) (treeNode, error) {
	var n treeNode
	work, err := e.op(w, sys, fmt.Sprintf("work before node %d", k), func() (err error) {
		if err := editProject(b.rootfs(), c.files, hostEdits, k); err != nil {
			return err
		}
		if n.at, err = (workload.Counter{Rootfs: b.rootfs()}).Advance(e.ctx, 1); err != nil {
			return err
		}
		if token != "" && n.at.Token != token {
			return fmt.Errorf("the agent's token is %s, the root's was %s: a restarted process", n.at.Token, token)
		}
		return nil
	})
	if err != nil {
		return n, err
	}
	m.work += work
	start := time.Now()
	n.hash, err = hashProject(b.rootfs())
	m.verify += time.Since(start)
	if err != nil {
		_, err = e.op(w, sys, fmt.Sprintf("hashing node %d", k), func() error { return err })
		return n, err
	}
	took, err := e.op(w, sys, fmt.Sprintf("checkpoint of node %d", k), func() error { return b.checkpoint(k) })
	if err != nil {
		return n, err
	}
	m.checkpoint = append(m.checkpoint, took)
	return n, nil
}

// overhead is the time checkpoints and rollbacks took in all.
func (m *measured) overhead() time.Duration { return sum(m.checkpoint) + sum(m.rollback) }
