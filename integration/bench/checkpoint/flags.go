package main

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

type options struct {
	mode               string // "quick" or "full"
	systems            []string
	out                string
	memMB, rootfsMB    []int
	forks              []int
	checkpoints, rolls int
	agentMemMB         int // the python agent sandbox's memory; with agentFiles 0 the workload is left out
	agentFiles         int
	tree               treeConfig // expansions 0: left out
	historyCkpts       int        // checkpoints of the agent history; 0: left out
	historyMemMB       int
	forked             forkedConfig
	only               string // the one workload to run; "" for all
}

// workloads are the names -only takes, in the order they run.
var workloads = []string{"idle", "memory", "filesystem", "agent", "agent-history", "exec", "fan-out", "fork-checkpoints", "tree"}

// fullOnly are the workloads the quick mode leaves out, by the flag that does: -only runs them
// with the full mode's value of that flag.
var fullOnly = map[string]string{"agent-history": "history-checkpoints"}

// runs says whether workload w runs: all do unless -only names another.
func (o options) runs(w string) bool { return o.only == "" || o.only == w }

// modes are the presets -full picks from; a flag given on the command line wins over its preset.
// The agent history (100 checkpoints of 256 MB, 2-3 minutes on a quiet machine, more under load)
// is in the full mode only; -only agent-history runs it in either mode (fullOnly).
// The quick mode keeps `make bench` within 10 minutes on 2 cores: the tree search runs the
// busybox agent (a shell), which restores in a fraction of python's time; the full mode runs
// every size the issue names and the tree search on the python sandbox.
var modes = map[string]map[string]string{
	"quick": {
		"mem-mb": "256", "rootfs-mb": "200", "forks": "1,10",
		"agent-mem-mb": "64", "agent-files": "2000",
		"tree-agent": string(busyboxAgent), "tree-files": "2000",
		"history-checkpoints": "0", "history-mem-mb": "256", "forked": "10", "forked-checkpoints": "10",
	},
	"full": {
		"mem-mb": "0,256,1024", "rootfs-mb": "0,200,1000", "forks": "1,10,100",
		"agent-mem-mb": "256", "agent-files": "3000",
		"tree-agent": string(pythonAgent), "tree-files": "3000",
		"history-checkpoints": "100", "history-mem-mb": "256", "forked": "10", "forked-checkpoints": "10",
	},
}

func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of bench (make bench, BENCH_ARGS for these):\n")
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\nExit status: 0 every operation succeeded; %d some failed, the results of the others complete\n"+
			"(failures.csv); 1 the run stopped (set-up failed, interrupted; the workloads finished are written); 2 usage.\n", exitFailures)
	}
	full := fs.Bool("full", false, "full mode: memory 0/256/1024 MB, rootfs 0/200/1000 MB, 1/10/100 forks, the tree search on the python sandbox (default: quick mode, 7-9 minutes here)")
	fs.StringVar(&o.out, "out", "", "results `DIR` (default bench-results/TIME)")
	lists := map[string]*string{}
	for _, f := range []struct{ name, usage string }{
		{"mem-mb", "comma-separated `SIZES` of held memory for the memory workload (0 is the idle workload)"},
		{"rootfs-mb", "comma-separated `SIZES` written to the rootfs for the filesystem workload (0 is the idle workload)"},
		{"forks", "comma-separated fan-out `COUNTS`"},
		{"agent-mem-mb", "`MB` the python agent sandbox holds"},
		{"agent-files", "`FILES` in the python agent sandbox's project (0 leaves the workload out)"},
		{"tree-agent", "the tree search's agent: busybox or python"},
		{"tree-files", "`FILES` in the tree search's project"},
		{"history-checkpoints", "`N` checkpoints of the agent history (cklite only; 0 leaves it out)"},
		{"history-mem-mb", "`MB` the agent of the agent history holds"},
		{"forked", "`N` forks of the fork-checkpoints workload (cklite only; 0 leaves it out)"},
		{"forked-checkpoints", "`N` checkpoints of each fork"},
	} {
		lists[f.name] = fs.String(f.name, "", f.usage+"; default: the mode's")
	}
	fs.StringVar(&o.only, "only", "", "run only `WORKLOAD`: "+strings.Join(workloads, ", ")+" (default all)")
	only := fs.String("systems", "", "measure only `SYSTEM` (cklite or stock); default both, taking turns")
	fs.IntVar(&o.checkpoints, "checkpoints", 8, "checkpoints per workload and system")
	fs.IntVar(&o.rolls, "rollbacks", 4, "rollbacks per workload and system")
	fs.IntVar(&o.tree.expansions, "tree-expansions", 100, "expansions of the tree search (0 leaves it out)")
	fs.IntVar(&o.tree.rollbacks, "tree-rollbacks", 49, "rollbacks of the tree search")
	fs.IntVar(&o.tree.maxDepth, "tree-depth", 8, "depth of the tree search")
	fs.Uint64Var(&o.tree.seed, "tree-seed", 6, "seed of the tree search's tree")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.systems = allSystems
	if *only != "" {
		if !slices.Contains(allSystems, *only) {
			return o, fmt.Errorf("-systems %q: want cklite or stock", *only)
		}
		o.systems = []string{*only}
	}
	if o.only != "" && !slices.Contains(workloads, o.only) {
		return o, fmt.Errorf("-only %q: want one of %s", o.only, strings.Join(workloads, ", "))
	}
	o.mode = "quick"
	if *full {
		o.mode = "full"
	}
	// Only flags left off take the mode's value: an empty list given leaves the workload out.
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for name, v := range lists {
		if !given[name] {
			*v = modes[o.mode][name]
			if fullOnly[o.only] == name {
				*v = modes["full"][name]
			}
		}
	}
	var errs []error
	ints := func(name string) []int {
		l, err := parseList("-"+name, *lists[name])
		errs = append(errs, err)
		return l
	}
	one := func(name string) int {
		l := ints(name)
		if len(l) != 1 {
			errs = append(errs, fmt.Errorf("-%s: want one number", name))
			return 0
		}
		return l[0]
	}
	o.memMB, o.rootfsMB, o.forks = ints("mem-mb"), ints("rootfs-mb"), ints("forks")
	o.agentMemMB, o.agentFiles, o.tree.files = one("agent-mem-mb"), one("agent-files"), one("tree-files")
	o.historyCkpts, o.historyMemMB = one("history-checkpoints"), one("history-mem-mb")
	o.forked = forkedConfig{forks: one("forked"), checkpoints: one("forked-checkpoints"),
		agent: agentSpec{kind: pythonAgent, memMB: o.agentMemMB, slow: true, churnKB: churnKB}}
	switch o.tree.agent = agentKind(*lists["tree-agent"]); o.tree.agent {
	case busyboxAgent, pythonAgent:
	default:
		errs = append(errs, fmt.Errorf("-tree-agent %q: want busybox or python", o.tree.agent))
	}
	if o.checkpoints < 1 || o.rolls < 1 {
		errs = append(errs, errors.New("-checkpoints and -rollbacks: want at least 1"))
	}
	if o.forked.forks > 0 && o.forked.checkpoints < 1 {
		errs = append(errs, errors.New("-forked-checkpoints: want at least 1"))
	}
	if o.tree.expansions > 0 && o.tree.files < 1 {
		errs = append(errs, errors.New("-tree-files: want at least 1"))
	}
	if o.out == "" {
		o.out = filepath.Join("bench-results", time.Now().Format("20060102-150405"))
	}
	return o, errors.Join(errs...)
}

func parseList(name, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%s %q: want non-negative numbers, such as 0,256", name, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// needsSandbox says whether a workload runs the python agent, whose image is imported then.
func (o options) needsSandbox() bool {
	return (o.runs("agent") && o.agentFiles > 0) || (o.runs("agent-history") && o.historyCkpts > 0) ||
		(o.runs("fork-checkpoints") && o.forked.forks > 0) || (o.runs("tree") && o.tree.expansions > 0 && o.tree.agent == pythonAgent)
}

// series lists the checkpoint/rollback workloads o selects, in the order they run.
func (o options) series() []series {
	var all []series
	if o.runs("idle") {
		all = append(all, series{workload: "idle", param: "busybox counter", agent: busyboxAgent})
	}
	for _, mb := range o.memMB {
		if mb > 0 && o.runs("memory") {
			all = append(all, series{workload: "memory", param: fmt.Sprintf("%d MB", mb), agent: busyboxAgent, memMB: mb})
		}
	}
	for _, mb := range o.rootfsMB {
		if mb > 0 && o.runs("filesystem") {
			all = append(all, series{workload: "filesystem", param: fmt.Sprintf("%d MB + 1 MB/ckpt", mb), agent: busyboxAgent, rootfsMB: mb})
		}
	}
	if o.agentFiles > 0 && o.runs("agent") {
		all = append(all, series{workload: "agent", param: fmt.Sprintf("python, %d MB, %d files", o.agentMemMB, o.agentFiles),
			agent: pythonAgent, memMB: o.agentMemMB, files: o.agentFiles})
	}
	if o.historyCkpts > 0 && o.runs("agent-history") {
		all = append(all, series{workload: "agent-history", param: fmt.Sprintf("python, %d MB, ~1 MB changed a ckpt", o.historyMemMB),
			agent: pythonAgent, memMB: o.historyMemMB, churnKB: churnKB, ckpts: o.historyCkpts, ckliteOnly: true})
	}
	return all
}

// churnKB is what the agent history's and the forks' agent rewrites of its memory on every
// count: a step (workload.Counter.Advance by 2, which the agent overshoots by a count at times)
// changes ~1 MB of its heap.
const churnKB = 384
