package main

import (
	"slices"
	"testing"
)

// The agent history is in the full mode only, unless -only names it or its flag is given; the
// forks' checkpoints run in both modes.
func TestModesPresets(t *testing.T) {
	for _, c := range []struct {
		args            []string
		history, forked int
		series          []string
		sandbox         bool
	}{
		{args: nil, history: 0, forked: 10, series: []string{"idle", "memory", "filesystem", "agent"}, sandbox: true},
		{args: []string{"-full"}, history: 100, forked: 10, series: []string{"idle", "memory", "memory", "filesystem", "filesystem", "agent", "agent-history"}, sandbox: true},
		{args: []string{"-only", "agent-history"}, history: 100, forked: 10, series: []string{"agent-history"}, sandbox: true},
		{args: []string{"-only", "agent-history", "-history-checkpoints", "7"}, history: 7, forked: 10, series: []string{"agent-history"}, sandbox: true},
		{args: []string{"-only", "fork-checkpoints"}, history: 0, forked: 10, series: nil, sandbox: true},
		{args: []string{"-only", "tree"}, history: 0, forked: 10, series: nil, sandbox: false},
	} {
		o, err := parseOptions(append([]string{"-out", t.TempDir()}, c.args...))
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		var names []string
		for _, s := range o.series() {
			names = append(names, s.workload)
		}
		if o.historyCkpts != c.history || o.forked.forks != c.forked || !slices.Equal(names, c.series) || o.needsSandbox() != c.sandbox {
			t.Errorf("%v: history %d, forks %d, series %v, sandbox %v; want %d, %d, %v, %v",
				c.args, o.historyCkpts, o.forked.forks, names, o.needsSandbox(), c.history, c.forked, c.series, c.sandbox)
		}
	}
}
