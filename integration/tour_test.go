package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cklite/cklite/integration/harness"
)

// tourMarker precedes the tour's block of commands in README.md and docs/setup.md.
const tourMarker = "<!-- tour:"

// tourTimeout bounds the tour; building the sandbox image the first time takes a minute or two.
const tourTimeout = 15 * time.Minute

// TestTour follows the README's tour as a new user would: the commands of its tour block, which
// docs/setup.md holds too, run literally by bash (-e: the first command that fails stops it).
// Around them is only what the install steps before the block and the user's own machine
// provide: the installed stack and cklite's binaries on PATH (make install; export PATH), a home
// directory (a scratch one: ~/cklite is in it), and a containerd namespace of the test's own in
// CONTAINERD_NAMESPACE (the tour uses whatever namespace the environment names), so that its
// cgroups are the test's.
func TestTour(t *testing.T) {
	for _, bin := range []string{"cklite", "cklite-snapshotter", "containerd-shim-cklite-v2"} {
		if !stack.Has(bin) {
			t.Skipf("%s is not built in %s: make build", bin, stack.ProjectBin)
		}
	}
	readme, doc := tourBlock(t, "../README.md"), tourBlock(t, "../docs/setup.md")
	if readme != doc {
		t.Fatalf("the tours of README.md and docs/setup.md differ:\n%s\n---\n%s", readme, doc)
	}
	s := newScratch(t, "tour-")

	ctx, cancel := context.WithTimeout(context.Background(), tourTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-u", "-o", "pipefail", "-x", "-c", readme)
	cmd.Dir = s.Dir
	cmd.Env = []string{"PATH=" + stack.Path(), "HOME=" + s.Dir, "CONTAINERD_NAMESPACE=" + s.Namespace}
	if cache := os.Getenv("CKLITE_CACHE"); cache != "" {
		cmd.Env = append(cmd.Env, "CKLITE_CACHE="+cache)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	err := cmd.Run()
	t.Logf("the tour took %s; its commands and output:\n%s", time.Since(start).Round(time.Millisecond), stderr.String())
	if err != nil {
		t.Fatalf("the tour failed: %v\nstdout:\n%s", err, stdout.String())
	}

	// The rollback brought the notes back as the checkpoint had them.
	out := stdout.String()
	if !strings.Contains(out, "\nstep 1\n") || strings.Contains(out, "oops") {
		t.Fatalf("after the rollback the agent's notes are not the checkpoint's (step 1); stdout:\n%s", out)
	}
	// The checkpoint went into this containerd's instance directory below ~/cklite.
	root := filepath.Join(s.Dir, "cklite")
	dirs, _ := filepath.Glob(filepath.Join(root, "lib", "cklite", "containerd", "*", "checkpoints", s.Namespace, "*"))
	if len(dirs) != 1 {
		t.Fatalf("checkpoint directories of the tour's containerd: %q, want one", dirs)
	}
	// daemon stop stopped both daemons.
	for _, name := range []string{"containerd", "cklite-snapshotter"} {
		if _, err := os.Stat(filepath.Join(root, "run", name+".pid")); !os.IsNotExist(err) {
			t.Errorf("%s's pid file is still there after cklite daemon stop (%v)", name, err)
		}
	}
	for _, sock := range []string{"containerd.sock", "snapshotter.sock"} {
		if harness.Serving(filepath.Join(root, "run", sock)) {
			t.Errorf("%s is still served after cklite daemon stop", sock)
		}
	}
}

// newScratch is a scratch directory for an instance the test starts through cklite's commands,
// torn down with all it runs when the test ends.
func newScratch(t *testing.T, prefix string) *harness.Scratch {
	t.Helper()
	s, err := harness.NewScratch(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("tearing down %s: %v", s.Dir, err)
		}
	})
	return s
}

// tourBlock is the fenced block that follows the tour marker in the Markdown file at path.
func tourBlock(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), tourMarker)
	if !ok {
		t.Fatalf("%s has no tour (a line %q before a ```sh block)", path, tourMarker)
	}
	_, after, ok = strings.Cut(after, "```sh\n")
	block, _, closed := strings.Cut(after, "```\n")
	if !ok || !closed {
		t.Fatalf("%s: no ```sh block after %q", path, tourMarker)
	}
	return block
}
