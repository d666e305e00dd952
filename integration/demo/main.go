// Command demo checkpoints a running container and rolls it back, on a private containerd started
// by the integration harness, and prints how long each step took. It is what the README's first
// command ends with (`make demo`).
//
// The runtime is containerd's stock runc shim with overlayfs, the baseline. cklite's shim and
// snapshotter take their place as they land, adding fork: stock `ctr containers restore` into a
// new name fails while the original runs, because the restored spec keeps the original's cgroup.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/localimage"
)

const (
	runtime    = "io.containerd.runc.v2"
	sandbox    = "sandbox"
	checkpoint = "checkpoint/sandbox:1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) (retErr error) {
	stack, err := harness.LoadStack()
	if err != nil {
		return err
	}
	criu, err := stack.CheckCRIU(ctx)
	if err != nil {
		return err
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
	version, err := d.Client().Version(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("containerd %s (private, in %s), runtime %s, snapshotter overlayfs, CRIU %s\n\n", version.Version, d.Dir, runtime, criu)

	step := func(name string, fn func() error) error {
		start := time.Now()
		if err := fn(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Printf("  %-48s %8.1f ms\n", name, float64(time.Since(start).Microseconds())/1000)
		return nil
	}
	ctr := func(args ...string) func() error {
		return func() error { _, err := d.Ctr(ctx, args...); return err }
	}

	if err := step("import busybox image", func() error { return d.Import(ctx, img) }); err != nil {
		return err
	}
	if err := step("run sandbox (a counting shell)", ctr("run", "-d", "--fifo-dir", d.FIFODir(), "--runtime", runtime,
		img.Name, sandbox, "sh", "-c", workload.CounterScript)); err != nil {
		return err
	}
	c := workload.Counter{Rootfs: d.RootfsPath(sandbox)}
	at, err := c.Advance(ctx, 5)
	if err != nil {
		return err
	}
	fmt.Printf("    sandbox counted to %d\n", at.N)

	if err := step("checkpoint memory + rw layer", ctr("containers", "checkpoint", "--task", "--rw", sandbox, checkpoint)); err != nil {
		return err
	}
	later, err := c.Advance(ctx, 5)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Rootfs, "bad-action"), []byte("rm -rf important/"), 0o644); err != nil {
		return err
	}
	fmt.Printf("    a bad action: counter moved on to %d, /bad-action written\n", later.N)

	if err := step("roll back (delete, restore --live --rw)", func() error {
		if err := ctr("tasks", "delete", "--force", sandbox)(); err != nil {
			return err
		}
		if err := ctr("containers", "delete", sandbox)(); err != nil {
			return err
		}
		return ctr("containers", "restore", "--live", "--rw", sandbox, checkpoint)()
	}); err != nil {
		return err
	}
	if err := expectAt(ctx, c, at); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(c.Rootfs, "bad-action")); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("/bad-action survived the rollback (stat: %v)", err)
	}
	fmt.Printf("    rolled back: counter at %d again, same process memory, /bad-action gone\n", at.N)

	return nil
}

// expectAt waits until the restored counter shows exactly the checkpointed state.
func expectAt(ctx context.Context, c workload.Counter, at workload.Count) error {
	_, err := c.WaitFor(ctx, fmt.Sprintf("the checkpointed state %+v", at), func(x workload.Count) bool { return x == at })
	return err
}
