// Command checkpoint is cklite's checkpoint benchmark (issue 6): on a private containerd started
// by the integration harness, with both the stock runc shim on overlayfs and cklite (runtime
// io.containerd.cklite.v2 on cklite-snapshotter), it measures side by side, the systems taking
// turns:
//
//   - idle: the busybox agent (a shell counter) with the probe;
//   - memory: the same next to a probe holding N MB of touched memory (-mem-mb);
//   - filesystem: M MB written to the rootfs first (-rootfs-mb), 1 MB changed before every checkpoint;
//   - agent: python3 in the debootstrap sandbox holding state in memory and editing a project
//     directory of a few thousand files (-agent-mem-mb, -agent-files);
//   - agent history: the python agent holding 256 MB checkpointed 100 times, ~1 MB of its heap
//     changed before each (-history-*), cklite only;
//   - exec: short execs, and checkpoints with 0 and 5 exec'd processes (execs.go);
//   - fan-out: 1, 10, ... forks of one checkpoint while the original runs (-forks);
//   - fork checkpoints: 10 forks of one checkpoint of the python agent, each checkpointed 10
//     times (-forked, -forked-checkpoints), cklite only;
//   - tree search: a seeded tree of 100 expansions and 49 rollbacks, depth 8, every restored node
//     verified by its memory counter and project hash (-tree-*).
//
// Metrics: checkpoint latency p50/p95, downtime during a checkpoint as a probe in the container
// sees it, CRIU's own breakdown of each dump (stats-dump, stats-restore in the CRIU work
// directory each checkpoint names), rollback latency, fork latency each and in total, disk growth
// over the checkpoints (in all, of filesystem state, with dedup), peak RSS of the shims and of
// cklite-snapshotter, and how many restores were verified. It prints a table with the
// cklite/stock ratio and writes results.csv, results.md, SVG charts and the log into -out. The quick mode
// (default) takes about 9 minutes on 2 cores; -full runs every size the issue names; -only runs
// one workload.
//
// A failed operation does not end the run (issue 21): it is recorded in failures.csv and in the
// table's failed and retried columns, and the exit status says whether every operation
// succeeded (failures.go). The results are rewritten after each workload, so an interrupted run
// leaves what it measured.
//
// It lives next to the harness rather than in the cklite CLI: it starts its own containerd from
// the installed stack and the checkout's bin/, and builds its probe with the Go toolchain, which
// an installed cklite has neither of. `make bench` runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/pkg/localimage"
)

const (
	ckliteSnapshotter = "cklite"
	imageName         = "localhost/cklite/bench:latest"
	probePackage      = "github.com/cklite/cklite/integration/bench/checkpoint/probe"
)

// Exit statuses: 0 when every operation succeeded; exitFailures when some failed but the run
// completed and its results are written (failures.csv lists them); 1 when the run itself could
// not go on (setting up, an interrupt: the results of the workloads finished are written); 2 for
// a bad command line.
const exitFailures = 3

func main() {
	o, err := parseOptions(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	failed, err := run(ctx, o)
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "bench: %v (the results of the workloads finished are in %s)\n", err, o.out)
	case failed > 0:
		fmt.Fprintf(os.Stderr, "bench: %d operations failed (failures.csv in %s); the results of the others are complete\n", failed, o.out)
	}
	os.Exit(exitStatus(failed, err))
}

// exitStatus is the benchmark's exit status after a run in which failed operations failed and
// which ended with err.
func exitStatus(failed int, err error) int {
	switch {
	case err != nil:
		return 1
	case failed > 0:
		return exitFailures
	}
	return 0
}

// env is what every workload needs: the systems under test, the run's context and its record of
// failures, and where progress goes (stdout and the log in the results directory).
type env struct {
	ctx     context.Context
	systems map[string]system
	rec     *recorder
	log     io.Writer
	started time.Time
}

// progress prints a line with the time since the benchmark started.
func (e *env) progress(format string, args ...any) {
	fmt.Fprintf(e.log, "[%4.0fs] %s\n", time.Since(e.started).Seconds(), fmt.Sprintf(format, args...))
}

// run starts the harness's containerd with both systems and runs the benchmark on them; it
// returns how many operations failed.
func run(ctx context.Context, o options) (failed int, retErr error) {
	started := time.Now()
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return 0, err
	}
	logFile, err := os.Create(filepath.Join(o.out, "bench.log"))
	if err != nil {
		return 0, err
	}
	defer logFile.Close()
	log := io.MultiWriter(os.Stdout, logFile)
	bb, err := localimage.Busybox(ctx, localimage.CacheDir(), os.Stderr)
	if err != nil {
		return 0, err
	}
	d, criu, err := harness.StartWithCklite(ctx)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err := d.Close(context.WithoutCancel(ctx)); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("cleaning up: %w", err))
		}
	}()
	dm := &daemon{d: d, ctx: d.Context(ctx)}
	e := &env{ctx: dm.ctx, systems: dm.systems(), rec: &recorder{}, log: log, started: started}
	// The probe and the image holding it live in the daemon's directory, gone with it.
	if dm.img, err = dm.buildImage(bb, filepath.Join(d.Dir, "bench-image")); err != nil {
		return 0, err
	}
	if o.needsSandbox() {
		e.progress("importing the python sandbox image into both snapshotters")
		sb, err := localimage.Sandbox(ctx, localimage.CacheDir(), os.Stderr)
		if err != nil {
			return 0, err
		}
		if dm.sandbox, err = d.ImportUnpacked(dm.ctx, sb, ckliteSnapshotter, "overlayfs"); err != nil {
			return 0, err
		}
	}
	version, err := d.Client().Version(dm.ctx)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(log, "cklite bench (%s): containerd %s in %s, CRIU %s\n  cklite: %s on cklite-snapshotter\n  stock:  %s on overlayfs\n"+
		"  %d checkpoints and %d rollbacks per workload and system; systems take turns\n\n",
		o.mode, version.Version, d.Dir, criu, harness.CkliteRuntime, runcRuntime, o.checkpoints, o.rolls)
	err = e.runAll(o)
	failed, _ = e.rec.tally()
	return failed, err
}

// runAll runs the workloads o selects on e's systems, writing every result into o.out after each
// workload, so that an interrupted run leaves what it measured. An operation's failure does not
// stop it (see failures.go); an interrupt or a failure of the benchmark itself does.
func (e *env) runAll(o options) error {
	systems = o.systems
	r := results{bySeries: map[series]map[string]*measured{}, rec: e.rec}
	write := func(final bool) error { return writeResults(e.log, o, r, time.Since(e.started), final) }
	for _, s := range o.series() {
		e.progress("=== %s: %s ===", s.workload, s.param)
		m, err := e.runSeries(s, s.checkpoints(o.checkpoints), o.rolls)
		if err != nil {
			return errors.Join(fmt.Errorf("%s %s: %w", s.workload, s.param, err), write(true))
		}
		r.series, r.bySeries[s] = append(r.series, s), m
		if err := write(false); err != nil {
			return err
		}
	}
	if o.runs("exec") {
		e.progress("=== exec: %d execs, %d checkpoints with 0 and with %d exec'd processes ===", execRuns, o.checkpoints, execExtras)
		execs, err := e.runExecs(o.checkpoints)
		if err != nil {
			return errors.Join(fmt.Errorf("exec: %w", err), write(true))
		}
		r.execs = execs
		if err := write(false); err != nil {
			return err
		}
	}
	if o.runs("fan-out") && len(o.forks) > 0 {
		e.progress("=== fan-out: %v forks of one checkpoint ===", o.forks)
		fanout, err := e.runFanout(o.forks)
		if err != nil {
			return errors.Join(fmt.Errorf("fan-out: %w", err), write(true))
		}
		r.fanout = fanout
		if err := write(false); err != nil {
			return err
		}
	}
	if o.runs("fork-checkpoints") && o.forked.forks > 0 {
		e.progress("=== fork checkpoints: %s ===", forkedParam(o.forked))
		m, err := e.runForked(o.forked)
		if err != nil {
			return errors.Join(fmt.Errorf("fork checkpoints: %w", err), write(true))
		}
		r.forked, r.forkedParam = m, forkedParam(o.forked)
		if err := write(false); err != nil {
			return err
		}
	}
	if o.runs("tree") && o.tree.expansions > 0 {
		e.progress("=== tree search: %d expansions, %d rollbacks, depth %d ===", o.tree.expansions, o.tree.rollbacks, o.tree.maxDepth)
		tree, err := e.runTree(o.tree)
		if err != nil {
			return errors.Join(fmt.Errorf("tree search: %w", err), write(true))
		}
		r.tree, r.treeParam = tree, treeParam(o.tree)
	}
	return write(true)
}

// buildImage builds the probe static and the busybox image with it as /usr/local/bin/probe, and
// imports and unpacks that image into both snapshotters.
func (e *daemon) buildImage(bb localimage.Image, dir string) (client.Image, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	probe := filepath.Join(dir, "probe")
	cmd := exec.CommandContext(e.ctx, "go", "build", "-o", probe, probePackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the probe: %w: %s", err, out)
	}
	img, err := localimage.Extend(e.ctx, bb, dir, imageName, map[string]string{"usr/local/bin/probe": probe})
	if err != nil {
		return nil, err
	}
	return e.d.ImportUnpacked(e.ctx, img, ckliteSnapshotter, "overlayfs")
}
