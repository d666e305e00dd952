// Command critest runs cri-tools' CRI validation suite, critest (`make deps-critest` builds it),
// against containerd's CRI plugin once with the cklite runtime handler and once with runc, and
// prints each handler's passed, failed and skipped counts and the cases whose outcome differs
// between them. `make critest` runs it.
//
// Each handler gets a private containerd started by the integration harness as the CRI tests
// start theirs: the CRI plugin with the cklite handler as contrib/kubernetes configures it (on
// cklite-snapshotter, no options table; -options-table adds one, the other form containerd
// passes to the shim) and runc's alongside, a CNI bridge with port mapping, and the locally built
// pause image. critest pulls its images from public registries, which this machine does not
// reach: the images it names are built here from the busybox image (images.go) and pushed to a
// private registry the harness starts, which each daemon uses as its mirror of those registries.
// (critest's --registry-prefix is no way round: it drops the tag of every image it renames, so
// pulls of busybox:1.29-2 ask for busybox:latest.)
//
// It reports and asserts nothing: exit status 0 when every handler's run completed, whatever
// the cases' outcomes. critest's output, its Ginkgo JSON report and containerd's log of each run
// are kept under -out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cklite/cklite/integration/harness"
)

// options are the command line's.
type options struct {
	critest      string
	handlers     []string
	focus, skip  string
	out          string
	optionsTable bool
}

func main() {
	var o options
	handlers := flag.String("handlers", harness.HandlerCklite+","+harness.HandlerRunc, "CRI runtime handlers to run critest with, in turn; the first is compared with the others")
	flag.StringVar(&o.critest, "critest", "", "critest binary (default: critest in the installed stack's bin, from make deps-critest)")
	flag.StringVar(&o.focus, "focus", "", "run only the cases matching this regular expression (critest's --ginkgo.focus)")
	flag.StringVar(&o.skip, "skip", "", "leave out the cases matching this regular expression (critest's --ginkgo.skip)")
	flag.StringVar(&o.out, "out", "", "`DIR` for critest's output and reports and containerd's logs (default critest-results/TIME)")
	flag.BoolVar(&o.optionsTable, "options-table", false, "register the cklite handler with an options table (containerd then passes runtimeoptions.v1.Options to the shim)")
	flag.Parse()
	o.handlers = strings.Split(*handlers, ",")
	if o.out == "" {
		o.out = filepath.Join("critest-results", time.Now().UTC().Format("20060102-150405"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "critest: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) (retErr error) {
	stack, err := harness.LoadStack()
	if err != nil {
		return err
	}
	if !stack.Has("containerd-shim-cklite-v2") || !stack.Has("cklite-snapshotter") {
		return fmt.Errorf("cklite's shim and snapshotter are not built in %s: run 'make build'", stack.ProjectBin)
	}
	if o.critest == "" {
		o.critest = filepath.Join(stack.Bin, "critest")
	}
	if _, err := os.Stat(o.critest); err != nil {
		return fmt.Errorf("%w: run 'make deps-critest' (contrib/install.sh --critest)", err)
	}
	if o.out, err = filepath.Abs(o.out); err != nil {
		return err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	reg, err := harness.StartRegistry(stack, "")
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, reg.Close()) }()
	work, err := os.MkdirTemp("", "critest-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := pushTestImages(ctx, reg, work); err != nil {
		return err
	}
	all := map[string]results{}
	for _, h := range o.handlers {
		fmt.Printf("critest with handler %s (output: %s)\n", h, filepath.Join(o.out, h+".log"))
		begin := time.Now()
		res, err := runHandler(ctx, stack, reg, h, o)
		if err != nil {
			return fmt.Errorf("handler %s: %w", h, err)
		}
		fmt.Printf("  %d passed, %d failed, %d skipped in %s\n", res.count("passed"), res.count("failed"), res.count("skipped"), time.Since(begin).Round(time.Second))
		all[h] = res
	}
	fmt.Println()
	printSummary(os.Stdout, o.handlers, all)
	return nil
}

// runHandler runs critest with handler on a containerd of its own and returns its outcomes.
func runHandler(ctx context.Context, stack *harness.Stack, reg *harness.Registry, handler string, o options) (_ results, retErr error) {
	cfg := harness.Config{Registry: reg, CkliteSnapshotter: true}
	if o.optionsTable {
		table := filepath.Join(o.out, "cklite-options.toml")
		conf := "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.cklite.options]\n  NoNewKeyring = false\n"
		if err := os.WriteFile(table, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		cfg.Imports = []string{table}
	}
	d, err := harness.Start(ctx, stack, cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		ctx := context.WithoutCancel(ctx)
		retErr = errors.Join(retErr, keepLog(filepath.Join(d.Dir, "containerd.log"), filepath.Join(o.out, handler+"-containerd.log")), d.Close(ctx))
	}()
	for _, upstream := range upstreams {
		if err := reg.WriteMirror(d.HostsDir, upstream); err != nil {
			return nil, err
		}
	}
	cri, err := d.CRI(ctx)
	if err != nil {
		return nil, err
	}
	defer cri.Close()
	removeBridge, err := cri.UseBridgeWithPorts(ctx, fmt.Sprintf("ckcrit%04x", rand.IntN(1<<16)), fmt.Sprintf("10.215.%d.0/24", rand.IntN(256)))
	if err != nil {
		return nil, err
	}
	// What critest left running goes through CRI first, which releases its addresses and port
	// rules, before the bridge goes.
	defer func() {
		retErr = errors.Join(retErr, cri.RemovePods(context.WithoutCancel(ctx)), removeBridge())
	}()
	report := filepath.Join(o.out, handler+".json")
	if err := runCritest(ctx, o, d.Address, handler, report); err != nil {
		return nil, err
	}
	return readReport(report)
}

// runCritest runs critest against the CRI socket address with handler, its output in
// handler.log and its Ginkgo report in report. A run with failed cases is not an error; one that
// left no report is.
func runCritest(ctx context.Context, o options, address, handler, report string) error {
	logf, err := os.Create(filepath.Join(o.out, handler+".log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{
		"--runtime-endpoint", "unix://" + address, "--image-endpoint", "unix://" + address,
		"--runtime-handler", handler,
		"--ginkgo.json-report", report, "--ginkgo.no-color", "--ginkgo.timeout", "3h",
	}
	if o.focus != "" {
		args = append(args, "--ginkgo.focus", o.focus)
	}
	if o.skip != "" {
		args = append(args, "--ginkgo.skip", o.skip)
	}
	cmd := exec.CommandContext(ctx, o.critest, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = o.out
	// critest is a test binary whose cases start their own goroutines, not processes: killing it
	// on an interrupt leaves nothing behind but what runHandler's teardown removes.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	runErr := cmd.Run()
	if _, err := os.Stat(report); err != nil {
		return fmt.Errorf("critest left no report (%v): see %s", runErr, logf.Name())
	}
	return nil
}

// keepLog copies a log that the daemon's teardown is about to remove.
func keepLog(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o644)
}
