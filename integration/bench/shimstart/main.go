// Command shimstart measures what a shim costs: in one private containerd it starts and deletes
// N busybox `sleep` containers with each runtime, the runtimes taking turns so that neither gets
// a quieter machine, and prints the start latency (NewTask + Start), the delete latency (Kill,
// Wait, Delete) and the shim's resident memory (VmRSS once the task runs, and the highest VmHWM,
// the peak, any shim reached), then cklite's ratios to runc's next to the targets of issue 4:
// cklite at most 1.0x runc's start latency and 1.2x its memory. It reports; it asserts nothing.
// `make bench-shim` runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/shimproc"
	"github.com/cklite/cklite/pkg/localimage"
)

const runcRuntime = "io.containerd.runc.v2"

func main() {
	n := flag.Int("n", 100, "containers per runtime")
	warmup := flag.Int("warmup", 2, "containers per runtime started first and not counted")
	flag.Parse()
	if *n < 1 {
		fmt.Fprintln(os.Stderr, "shimstart: -n must be at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *n, *warmup); err != nil {
		fmt.Fprintf(os.Stderr, "shimstart: %v\n", err)
		os.Exit(1)
	}
}

// sample is one container's measurements.
type sample struct {
	start, delete time.Duration
	shim          shimproc.Memory
}

func run(ctx context.Context, n, warmup int) (retErr error) {
	stack, err := harness.LoadStack()
	if err != nil {
		return err
	}
	runtimes := []string{runcRuntime}
	if stack.Has(shimproc.Binary(harness.CkliteRuntime)) {
		runtimes = append(runtimes, harness.CkliteRuntime)
	} else {
		fmt.Printf("%s not built (no %s in %s): measuring runc only\n\n", harness.CkliteRuntime, shimproc.Binary(harness.CkliteRuntime), stack.ProjectBin)
	}
	img, err := localimage.Busybox(ctx, localimage.CacheDir(), os.Stderr)
	if err != nil {
		return err
	}
	d, err := harness.Start(ctx, stack, harness.Config{})
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, d.Close(context.WithoutCancel(ctx))) }()
	if err := d.Import(ctx, img); err != nil {
		return err
	}
	ctx = d.Context(ctx)
	image, err := d.Client().GetImage(ctx, img.Name)
	if err != nil {
		return err
	}
	if err := image.Unpack(ctx, ""); err != nil {
		return err
	}
	version, err := d.Client().Version(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("containerd %s, snapshotter overlayfs, %d busybox `sleep` containers per runtime (after %d warm-up), runtimes taking turns\n\n",
		version.Version, n, warmup)

	samples := map[string][]sample{}
	for i := range warmup + n {
		for _, rt := range runtimes {
			s, err := startDelete(ctx, d, image, rt, fmt.Sprintf("bench-%d-%s", i, shimproc.Binary(rt)))
			if err != nil {
				return fmt.Errorf("%s, container %d: %w", rt, i, err)
			}
			if i >= warmup {
				samples[rt] = append(samples[rt], s)
			}
		}
	}
	report(runtimes, samples)
	return nil
}

// startDelete creates container id, times its task's creation and start, reads its shim's memory,
// and times the task's kill and delete. Creating the container and its snapshot, the same work for
// every runtime, is not timed.
func startDelete(ctx context.Context, d *harness.Daemon, image client.Image, rt, id string) (sample, error) {
	var s sample
	c, err := d.Client().NewContainer(ctx, id,
		client.WithRuntime(rt, nil),
		client.WithNewSnapshot(id, image),
		client.WithNewSpec(oci.WithImageConfig(image), oci.WithProcessArgs("sleep", "3600")))
	if err != nil {
		return s, err
	}
	defer c.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup)

	begin := time.Now()
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		return s, err
	}
	if err := task.Start(ctx); err != nil {
		_, _ = task.Delete(ctx, client.WithProcessKill)
		return s, err
	}
	s.start = time.Since(begin)

	pids := shimproc.Find(d.Address, id)
	if len(pids) != 1 {
		_, _ = task.Delete(ctx, client.WithProcessKill)
		return s, fmt.Errorf("found %d shims serving %s, want 1", len(pids), id)
	}
	if s.shim, err = shimproc.ReadMemory(pids[0]); err != nil {
		_, _ = task.Delete(ctx, client.WithProcessKill)
		return s, err
	}

	begin = time.Now()
	exitC, err := task.Wait(ctx)
	if err != nil {
		return s, err
	}
	if err := task.Kill(ctx, syscall.SIGKILL); err != nil {
		return s, err
	}
	<-exitC
	if _, err := task.Delete(ctx); err != nil {
		return s, err
	}
	s.delete = time.Since(begin)
	return s, nil
}

// stats summarises one runtime's samples.
type stats struct {
	startP50, startP90, deleteP50 float64 // milliseconds
	rssP50, anonP50, peak         float64 // MiB
}

func summarise(samples []sample) stats {
	pick := func(f func(sample) float64) []float64 {
		var v []float64
		for _, s := range samples {
			v = append(v, f(s))
		}
		slices.Sort(v)
		return v
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	mib := func(b uint64) float64 { return float64(b) / (1 << 20) }
	starts := pick(func(s sample) float64 { return ms(s.start) })
	deletes := pick(func(s sample) float64 { return ms(s.delete) })
	rss := pick(func(s sample) float64 { return mib(s.shim.RSS) })
	anon := pick(func(s sample) float64 { return mib(s.shim.Anon) })
	peaks := pick(func(s sample) float64 { return mib(s.shim.Peak) })
	return stats{
		startP50: percentile(starts, 0.5), startP90: percentile(starts, 0.9), deleteP50: percentile(deletes, 0.5),
		rssP50: percentile(rss, 0.5), anonP50: percentile(anon, 0.5), peak: peaks[len(peaks)-1],
	}
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func report(runtimes []string, samples map[string][]sample) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "runtime\tstart p50\tstart p90\tdelete p50\tshim RSS p50\tof it anon p50\tshim peak RSS (max VmHWM)\t")
	all := map[string]stats{}
	for _, rt := range runtimes {
		s := summarise(samples[rt])
		all[rt] = s
		fmt.Fprintf(w, "%s\t%.1f ms\t%.1f ms\t%.1f ms\t%.1f MiB\t%.1f MiB\t%.1f MiB\t\n", rt, s.startP50, s.startP90, s.deleteP50, s.rssP50, s.anonP50, s.peak)
	}
	if ck, ok := all[harness.CkliteRuntime]; ok {
		rc := all[runcRuntime]
		fmt.Fprintf(w, "cklite / runc\t%.2fx\t%.2fx\t%.2fx\t%.2fx\t%.2fx\t%.2fx\t\n",
			ck.startP50/rc.startP50, ck.startP90/rc.startP90, ck.deleteP50/rc.deleteP50, ck.rssP50/rc.rssP50, ck.anonP50/rc.anonP50, ck.peak/rc.peak)
		fmt.Fprintln(w, "target (issue 4)\t<= 1.00x\t<= 1.00x\t\t<= 1.20x\t\t<= 1.20x\t")
	}
	w.Flush()
}
