// Package integration holds cklite's end-to-end tests. They run against a real containerd started
// by the harness, with the real nerdctl, ctr, CRIU and containerd Go client: nothing is faked.
// They need root and the stack `make deps` installs; `make test` provides both.
package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/pkg/localimage"
)

// Shared by every test: the stack, a local registry, and the busybox image (imported by name
// localimage's Image.Name, pushed to the registry as busyboxRef).
var (
	stack      *harness.Stack
	registry   *harness.Registry
	busybox    localimage.Image
	busyboxRef string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	if err := setup(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "integration setup: %v\n", err)
		return 1
	}
	defer registry.Close()
	return m.Run()
}

func setup(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("integration tests start containerd and need root: run 'sudo make test'")
	}
	var err error
	if stack, err = harness.LoadStack(); err != nil {
		return err
	}
	if _, err := stack.CheckCRIU(ctx); err != nil {
		return err
	}
	if busybox, err = localimage.Busybox(ctx, localimage.CacheDir(), os.Stderr); err != nil {
		return err
	}
	if registry, err = harness.StartRegistry(stack, ""); err != nil {
		return err
	}
	if busyboxRef, err = registry.Push(ctx, busybox, "cklite/busybox:latest"); err != nil {
		registry.Close()
		return err
	}
	return nil
}

// startDaemon starts a private containerd for one test, reachable to the shared registry, and
// tears it down when the test ends.
func startDaemon(t *testing.T, cfg harness.Config) *harness.Daemon {
	t.Helper()
	cfg.Registry = registry
	d, err := harness.Start(context.Background(), stack, cfg)
	if err != nil {
		t.Fatalf("starting containerd: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("end of %s:\n%s", filepath.Join(d.Dir, "containerd.log"), d.LogTail(40))
		}
		if err := d.Close(context.Background()); err != nil {
			t.Errorf("tearing down containerd: %v", err)
		}
	})
	return d
}

func ctr(t *testing.T, d *harness.Daemon, args ...string) string {
	t.Helper()
	out, err := d.Ctr(context.Background(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ctrRun is `ctr run` with the task's FIFOs kept in the daemon's directory.
func ctrRun(t *testing.T, d *harness.Daemon, args ...string) string {
	t.Helper()
	return ctr(t, d, append([]string{"run", "--fifo-dir", d.FIFODir()}, args...)...)
}

func nerdctl(t *testing.T, d *harness.Daemon, args ...string) string {
	t.Helper()
	out, err := d.Nerdctl(context.Background(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
