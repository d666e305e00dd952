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
//   - fan-out: 1, 10, ... forks of one checkpoint while the original runs (-forks);
//   - tree search: a seeded tree of 100 expansions and 49 rollbacks, depth 8, every restored node
//     verified by its memory counter and project hash (-tree-*).
//
// Metrics: checkpoint latency p50/p95, downtime during a checkpoint as a probe in the container
// sees it, CRIU's own breakdown of each dump (stats-dump, stats-restore in the CRIU work
// directory each checkpoint names), rollback latency, fork latency each and in total, disk growth
// over the checkpoints (in all, of filesystem state, with dedup), peak RSS of the shims and of
// cklite-snapshotter, and how many restores were verified. It prints a table with the
// cklite/stock ratio and writes results.csv, results.md and SVG charts into -out. The quick mode
// (default) takes about 9 minutes on 2 cores; -full runs every size the issue names.
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
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// env is what every workload needs: the daemon, its client context, the image.
type env struct {
	d       *harness.Daemon
	ctx     context.Context // in the daemon's namespace
	img     client.Image    // busybox with the probe
	sandbox client.Image    // the debootstrap + python3 sandbox, for the python agent
	started time.Time
	snapPID int // cklite-snapshotter's, found on first use
}

// progress prints a line with the time since the benchmark started.
func (e *env) progress(format string, args ...any) {
	fmt.Printf("[%4.0fs] %s\n", time.Since(e.started).Seconds(), fmt.Sprintf(format, args...))
}

func run(ctx context.Context, o options) (retErr error) {
	systems = o.systems
	started := time.Now()
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	bb, err := localimage.Busybox(ctx, localimage.CacheDir(), os.Stderr)
	if err != nil {
		return err
	}
	d, criu, err := harness.StartWithCklite(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err := d.Close(context.WithoutCancel(ctx)); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("cleaning up: %w", err))
		}
	}()
	e := &env{d: d, ctx: d.Context(ctx), started: started}
	// The probe and the image holding it live in the daemon's directory, gone with it.
	if e.img, err = e.buildImage(bb, filepath.Join(d.Dir, "bench-image")); err != nil {
		return err
	}
	if o.needsSandbox() {
		e.progress("importing the python sandbox image into both snapshotters")
		sb, err := localimage.Sandbox(ctx, localimage.CacheDir(), os.Stderr)
		if err != nil {
			return err
		}
		if e.sandbox, err = d.ImportUnpacked(e.ctx, sb, ckliteSnapshotter, "overlayfs"); err != nil {
			return err
		}
	}
	version, err := d.Client().Version(e.ctx)
	if err != nil {
		return err
	}
	fmt.Printf("cklite bench (%s): containerd %s in %s, CRIU %s\n  cklite: %s on cklite-snapshotter\n  stock:  %s on overlayfs\n"+
		"  %d checkpoints and %d rollbacks per workload and system; systems take turns\n\n",
		o.mode, version.Version, d.Dir, criu, harness.CkliteRuntime, runcRuntime, o.checkpoints, o.rolls)

	all := o.series()
	res := map[series]map[string]*measured{}
	for _, s := range all {
		e.progress("=== %s: %s ===", s.workload, s.param)
		r, err := e.runSeries(s, o.checkpoints, o.rolls)
		if err != nil {
			return fmt.Errorf("%s %s: %w", s.workload, s.param, err)
		}
		res[s] = r
	}
	var fanout map[int]map[string]*measured
	if len(o.forks) > 0 {
		e.progress("=== fan-out: %v forks of one checkpoint ===", o.forks)
		if fanout, err = e.runFanout(o.forks); err != nil {
			return fmt.Errorf("fan-out: %w", err)
		}
	}
	var tree map[string]*measured
	if o.tree.expansions > 0 {
		e.progress("=== tree search: %d expansions, %d rollbacks, depth %d ===", o.tree.expansions, o.tree.rollbacks, o.tree.maxDepth)
		if tree, err = e.runTree(o.tree); err != nil {
			return fmt.Errorf("tree search: %w", err)
		}
	}
	took := time.Since(started)
	return writeResults(o, results{series: all, bySeries: res, fanout: fanout, tree: tree}, took)
}

// buildImage builds the probe static and the busybox image with it as /usr/local/bin/probe, and
// imports and unpacks that image into both snapshotters.
func (e *env) buildImage(bb localimage.Image, dir string) (client.Image, error) {
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
