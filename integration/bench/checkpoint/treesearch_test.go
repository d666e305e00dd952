package main

import (
	"slices"
	"strings"
	"testing"
)

// The tree the issue names: every parent made before its child, exactly the rollbacks asked
// for, no node deeper than the limit, and the same tree for the same seed.
func TestPlanTree(t *testing.T) {
	for _, c := range []treeConfig{
		{seed: 6, expansions: 100, rollbacks: 49, maxDepth: 8},
		{seed: 1, expansions: 6, rollbacks: 2, maxDepth: 8},
		{seed: 2, expansions: 30, rollbacks: 15, maxDepth: 4},
	} {
		parent, err := planTree(c)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if len(parent) != c.expansions+1 {
			t.Fatalf("%+v: %d nodes, want %d", c, len(parent), c.expansions+1)
		}
		depth, rolls := []int{0}, 0
		for k := 1; k < len(parent); k++ {
			if parent[k] < 0 || parent[k] >= k {
				t.Fatalf("%+v: node %d expanded from %d", c, k, parent[k])
			}
			if parent[k] != k-1 {
				rolls++
			}
			depth = append(depth, depth[parent[k]]+1)
		}
		if rolls != c.rollbacks || slices.Max(depth) > c.maxDepth {
			t.Errorf("%+v: %d rollbacks, depth %d", c, rolls, slices.Max(depth))
		}
		again, _ := planTree(c)
		if !slices.Equal(parent, again) {
			t.Errorf("%+v: a second plan differs", c)
		}
	}
}

// shAgent patches workload.CounterScript by text: a change there must not leave the agent
// without its edits or its pace.
func TestShAgentPatchesTheCounter(t *testing.T) {
	for _, period := range []string{"0.02", "0.1"} {
		s := shAgent(period)
		if !strings.Contains(s, "/work/project/edits/e$((i % 100))") || !strings.Contains(s, "sleep "+period+"\n") {
			t.Errorf("shAgent(%s) does not edit the project or loop at that pace:\n%s", period, s)
		}
	}
}
