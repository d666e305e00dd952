// Command demo shows what cklite does, next to stock containerd, on a private containerd started
// by the integration harness: a running container (the "agent", a shell counting in memory) is
// checkpointed while it keeps running, does something bad (deletes and overwrites files, counts
// on), is rolled back to the checkpoint (memory and files), and is forked into three sandboxes
// running next to it. The same steps run on cklite (runtime io.containerd.cklite.v2 on the cklite
// snapshotter) and on the stock runc shim with overlayfs, through the containerd Go client (and
// cklite's forks through the cklite CLI), and a table of timings ends the run. It is what the README's first command ends with
// (`make demo`).
//
// It runs it all twice: for an idle busybox and for one that writes 200 MB to its root filesystem
// before each checkpoint (-rootfs-mb 0,200, the default). -reps 5 repeats each step and reports
// medians (`make bench-checkpoint`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/localimage"
)

const (
	ckliteSnapshotter = "cklite"
	forks             = 3 // sandboxes forked from each cklite checkpoint
)

func main() {
	sizes := flag.String("rootfs-mb", "0,200", "comma-separated `SIZES`: run once per size, the agent writing that many MB to its root filesystem before each checkpoint (0: an idle busybox)")
	reps := flag.Int("reps", 1, "checkpoint, roll back and fork `N` times per size and runtime; the table shows medians")
	flag.Parse()
	mbs, err := parseSizes(*sizes)
	if err == nil && *reps < 1 {
		err = fmt.Errorf("-reps %d: want at least 1", *reps)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, mbs, *reps); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func parseSizes(s string) ([]int, error) {
	var mbs []int
	for _, f := range strings.Split(s, ",") {
		mb, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || mb < 0 {
			return nil, fmt.Errorf("-rootfs-mb %q: want sizes in MB, such as 0,200", s)
		}
		if !slices.Contains(mbs, mb) {
			mbs = append(mbs, mb)
		}
	}
	return mbs, nil
}

// env is what every step needs: the daemon, its client context, the busybox image.
type env struct {
	d   *harness.Daemon
	ctx context.Context // in the daemon's namespace
	img client.Image
	mb  int // MB of data in the agent's /work/data, in this scenario
}

func run(ctx context.Context, mbs []int, reps int) (retErr error) {
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
		} else if retErr == nil {
			fmt.Println("\nCleaned up: containers, containerd, cklite-snapshotter, mounts and files are gone.")
		}
	}()
	e := &env{d: d, ctx: d.Context(ctx)}
	if e.img, err = e.importBusybox(bb); err != nil {
		return err
	}
	version, err := d.Client().Version(e.ctx)
	if err != nil {
		return err
	}
	fmt.Printf(`cklite demo: checkpoint, roll back and fork a running container, next to stock containerd.

A private containerd %s runs in %s (CRIU %s), with both:
  cklite  runtime %s, snapshotter cklite (cklite-snapshotter)
  stock   runtime %s, snapshotter overlayfs
In each, an "agent" container (busybox) runs a shell that counts in memory and writes its count
to /tmp/count, and keeps its work in /work. Every step goes through the containerd Go client,
cklite's forks through the cklite CLI.
`, version.Version, d.Dir, criu, harness.CkliteRuntime, runcRuntime)
	if reps > 1 {
		fmt.Printf("Each step runs %d times; the table shows medians.\n", reps)
	}

	var results []result
	for _, mb := range mbs {
		r, err := e.scenario(mb, reps)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	report(results, reps)
	return nil
}

// importBusybox imports the busybox image and unpacks it for both snapshotters.
func (e *env) importBusybox(bb localimage.Image) (client.Image, error) {
	return e.d.ImportUnpacked(e.ctx, bb, ckliteSnapshotter, "overlayfs")
}

// sandbox is an agent container on one runtime, and what the demo does to it.
type sandbox interface {
	rootfs() string
	// checkpoint checkpoints memory and root filesystem, leaving the agent running.
	checkpoint(rep int) error
	// rollback restores the agent's last checkpoint into the same container.
	rollback() error
	// fork restores the last checkpoint into new containers, checks each holds the checkpoint's
	// state (the agent at `at`, the files of round rep), removes them again, and returns how long
	// each took to start.
	fork(rep int, at workload.Count, say sayFunc) ([]time.Duration, error)
}

// sayFunc prints a line of the story, indented; in rounds after the first it prints nothing.
type sayFunc func(format string, args ...any)

// result holds one scenario's timings, by runtime and step.
type result struct {
	mb      int
	timings map[string]map[string][]time.Duration
	// stockFork is how stock refused to fork while the original runs ("" if it did not).
	stockFork string
}

const (
	stepCheckpoint = "checkpoint"
	stepRollback   = "rollback"
	stepFork       = "fork"
)

// scenario runs the agent on both runtimes with mb MB written to its rootfs, reps rounds each,
// the runtimes taking turns so that neither gets a quieter machine.
func (e *env) scenario(mb, reps int) (result, error) {
	e = &env{d: e.d, ctx: e.ctx, img: e.img, mb: mb}
	res := result{mb: mb, timings: map[string]map[string][]time.Duration{}}
	what := "an idle busybox container"
	if mb > 0 {
		what = fmt.Sprintf("a busybox container that writes %d MB to its root filesystem before each checkpoint", mb)
	}
	fmt.Printf("\n=== %s ===\n", what)
	boxes := map[string]sandbox{}
	var ids []string
	for _, rt := range runtimes {
		id := fmt.Sprintf("%s-%s", rt, sizeName(mb))
		ids = append(ids, id)
		var sb sandbox
		var err error
		if rt == "cklite" {
			sb, err = e.newCklite(id)
		} else {
			sb, err = e.newStock(id)
		}
		if err != nil {
			return res, fmt.Errorf("%s: starting the agent: %w", rt, err)
		}
		boxes[rt] = sb
		res.timings[rt] = map[string][]time.Duration{}
	}
	for rep := 1; rep <= reps; rep++ {
		for _, rt := range runtimes {
			if err := e.round(rt, boxes[rt], rep, &res); err != nil {
				return res, fmt.Errorf("%s, round %d: %w", rt, rep, err)
			}
		}
	}
	if err := e.showCheckpoints(); err != nil {
		return res, err
	}
	return res, e.cleanup(ids)
}

var runtimes = []string{"cklite", "stock"}

func sizeName(mb int) string {
	if mb == 0 {
		return "idle"
	}
	return fmt.Sprintf("%dmb", mb)
}

// round is one checkpoint, bad action, rollback and fork of sb, told step by step in the first
// round and in one line in the others.
func (e *env) round(rt string, sb sandbox, rep int, res *result) error {
	t := res.timings[rt]
	narrate := rep == 1
	say := sayFunc(func(format string, args ...any) {
		if narrate {
			fmt.Printf("  "+format+"\n", args...)
		}
	})
	if narrate {
		fmt.Printf("%s:\n", rt)
	}
	c := workload.Counter{Rootfs: sb.rootfs()}
	if err := writeWork(sb.rootfs(), rep, e.mb); err != nil {
		return err
	}
	at, err := c.Advance(e.ctx, 5)
	if err != nil {
		return err
	}
	if e.mb > 0 {
		say("the agent counted to %d and wrote /work/notes.txt and %d MB of random data to /work/data", at.N, e.mb)
	} else {
		say("the agent counted to %d and wrote /work/notes.txt", at.N)
	}

	timed := func(step string, fn func() error) (time.Duration, error) {
		start := time.Now()
		if err := fn(); err != nil {
			return 0, fmt.Errorf("%s: %w", step, err)
		}
		took := time.Since(start)
		t[step] = append(t[step], took)
		return took, nil
	}
	took, err := timed(stepCheckpoint, func() error { return sb.checkpoint(rep) })
	if err != nil {
		return err
	}
	say("%-62s %9s", "checkpoint: memory + filesystem, the agent keeps running", ms(took))
	line := fmt.Sprintf("  round %d, %-7s checkpoint %s", rep, rt+":", ms(took))

	after, err := c.Advance(e.ctx, 5)
	if err != nil {
		return fmt.Errorf("after the checkpoint: %w", err)
	}
	if after.Token != at.Token {
		return fmt.Errorf("the agent restarted at the checkpoint: token %s, was %s", after.Token, at.Token)
	}
	if err := badAction(sb.rootfs()); err != nil {
		return err
	}
	say("bad action: rm -rf /work, /etc/passwd overwritten; the agent counted on to %d", after.N)

	if took, err = timed(stepRollback, sb.rollback); err != nil {
		return err
	}
	say("%-62s %9s", "roll back to the checkpoint", ms(took))
	line += ", rollback " + ms(took)
	if err := expectCheckpointed(e.ctx, sb.rootfs(), at, rep, e.mb); err != nil {
		return fmt.Errorf("after the rollback: %w", err)
	}
	say("  the agent is at %d again, same process (token %s), /work and /etc/passwd are back", at.N, at.Token[:8])

	forkTimes, err := sb.fork(rep, at, say)
	if err != nil {
		return fmt.Errorf("fork: %w", err)
	}
	t[stepFork] = append(t[stepFork], forkTimes...)
	for i, took := range forkTimes {
		if i == 0 {
			line += ", fork " + ms(took)
		} else {
			line += ", " + ms(took)
		}
	}
	if st, ok := sb.(*stock); ok && st.refused != "" {
		res.stockFork = st.refused
	}
	if !narrate {
		fmt.Println(line)
	}
	return nil
}

// ms formats d in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000)
}
