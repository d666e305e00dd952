package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// showCheckpoints prints `cklite checkpoint ls`: the checkpoints the shim took of the cklite agent,
// each on the one it was rolled back to.
func (e *env) showCheckpoints() error {
	out, err := e.d.Cklite(e.ctx, "checkpoint", "ls")
	if err != nil {
		return err
	}
	fmt.Println("cklite's checkpoints, as the cklite CLI lists them:\n  $ cklite checkpoint ls")
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		fmt.Println("  " + l)
	}
	return nil
}

// cleanup removes the scenario's containers and cklite checkpoints, so that the next scenario
// runs on a quiet machine and lists only its own.
func (e *env) cleanup(ids []string) error {
	for _, id := range ids {
		if err := e.remove(id); err != nil {
			return err
		}
	}
	out, err := e.d.Cklite(e.ctx, "checkpoint", "ls", "-q")
	if err != nil || strings.TrimSpace(out) == "" {
		return err
	}
	_, err = e.d.Cklite(e.ctx, append([]string{"checkpoint", "rm", "--gc"}, strings.Fields(out)...)...)
	return err
}

// report prints the timings of every scenario side by side: the median of each step, per
// runtime, and stock's time over cklite's.
func report(results []result, reps int) {
	rounds := "one round (single steps are noisy; -reps 5 gives medians)"
	if reps > 1 {
		rounds = fmt.Sprintf("median of %d rounds", reps)
	}
	fmt.Printf("\nTimings, %s.\nfork: each of the %d forks on cklite, the one stock can make at a time.\n\n", rounds, forks)
	const stepCol, group = "%-28s", "   %9s %9s %7s"
	head, sub := fmt.Sprintf(stepCol, ""), fmt.Sprintf(stepCol, "")
	for _, r := range results {
		what := "idle busybox"
		if r.mb > 0 {
			what = fmt.Sprintf("%d MB written to rootfs", r.mb)
		}
		head += fmt.Sprintf("   %-27s", what)
		sub += fmt.Sprintf(group, "cklite", "stock", "ratio")
	}
	fmt.Println(strings.TrimRight(head, " "))
	fmt.Println(sub)
	for _, step := range []struct{ key, name string }{
		{stepCheckpoint, "checkpoint (keeps running)"},
		{stepRollback, "rollback (memory + files)"},
		{stepFork, "fork (each)"},
	} {
		line := fmt.Sprintf(stepCol, step.name)
		for _, r := range results {
			ck, st := median(r.timings["cklite"][step.key]), median(r.timings["stock"][step.key])
			stock := ms(st)
			if step.key == stepFork && r.stockFork != "" {
				stock += "*"
			}
			line += fmt.Sprintf(group, ms(ck), stock, fmt.Sprintf("%.1fx", float64(st)/float64(ck)))
		}
		fmt.Println(line)
	}
	fmt.Println("\n(ratio: stock's time over cklite's; above 1x cklite is faster)")
	for _, r := range results {
		if r.stockFork != "" {
			fmt.Printf("\n* Stock cannot fork while the original runs the way ctr restores (the checkpointed spec, which\n"+
				"  names the original's cgroup): restoring into a new container fails (%s).\n"+
				"  A client that rewrites the fork's cgroup path can (the benchmark, integration/bench/checkpoint, does).\n"+
				"  Its fork time is a restore into a new container with the original stopped, one at a time;\n"+
				"  cklite's forks run next to the original and to each other.\n", r.stockFork)
			break
		}
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
