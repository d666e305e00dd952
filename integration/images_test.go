package integration

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/pkg/localimage"
)

// TestLocalImages checks every way a locally built image reaches containerd: `nerdctl pull` from
// the local registry (through the daemon's hosts.toml), `ctr images import` and `nerdctl load`.
func TestLocalImages(t *testing.T) {
	d := startDaemon(t, harness.Config{})

	nerdctl(t, d, "pull", "--quiet", busyboxRef)
	if out := nerdctl(t, d, "run", "--rm", "--net", "none", busyboxRef, "echo", "pulled"); strings.TrimSpace(out) != "pulled" {
		t.Fatalf("container from the pulled image printed %q", out)
	}

	ctr(t, d, "images", "import", busybox.Archive)
	if out := ctrRun(t, d, "--rm", busybox.Name, "imported", "echo", "imported"); strings.TrimSpace(out) != "imported" {
		t.Fatalf("container from the imported image printed %q", out)
	}

	ctr(t, d, "images", "rm", busybox.Name)
	nerdctl(t, d, "load", "--input", busybox.Archive)
	if out := nerdctl(t, d, "images", "--format", "{{.Repository}}:{{.Tag}}"); !strings.Contains(out, strings.TrimPrefix(busybox.Name, "docker.io/")) {
		t.Fatalf("nerdctl images after nerdctl load does not list %s:\n%s", busybox.Name, out)
	}
}

// TestSandboxImage builds (once, then cached) the agent sandbox image, a Debian minbase with
// python3, and runs python in it after a push to and pull from the local registry.
func TestSandboxImage(t *testing.T) {
	ctx := context.Background()
	img, err := localimage.Sandbox(ctx, localimage.CacheDir(), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := registry.Push(ctx, img, "cklite/sandbox:latest")
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, harness.Config{})
	nerdctl(t, d, "pull", "--quiet", ref)
	out := nerdctl(t, d, "run", "--rm", "--net", "none", ref, "python3", "-c", "import sys; print(sys.version_info[0] * 14)")
	if strings.TrimSpace(out) != "42" {
		t.Fatalf("python3 in the sandbox image printed %q", out)
	}
}
