package integration

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cklite/cklite/integration/harness"
)

// TestSetupExisting adds cklite to a containerd that does not know it, as docs/setup.md tells:
// `cklite setup --existing` for the containerd's socket, `cklite daemon start` (the snapshotter
// alone), and the snippet in containerd's imports. containerd then serves cklite's snapshotter
// and differ from the snippet alone, and a container on them checkpoints and rolls back.
func TestSetupExisting(t *testing.T) {
	skipUnbuiltShim(t, harness.CkliteRuntime)
	s := newScratch(t, "existing-")
	root := filepath.Join(s.Dir, "cklite")
	ctrdDir := filepath.Join(s.Dir, "ctrd")
	address := filepath.Join(ctrdDir, "containerd.sock")
	out := runCklite(t, s.Dir, "setup", "--existing", "--root", root, "--address", address)
	snippet := filepath.Join(root, "etc", "containerd-cklite.toml")
	if !strings.Contains(out, `imports = ["`+snippet+`"]`) {
		t.Fatalf("cklite setup --existing does not tell the imports line for %s:\n%s", snippet, out)
	}
	runCklite(t, s.Dir, "daemon", "start", "--root", root)

	// Registered after the scratch directory's cleanup, so containerd stops before the
	// snapshotter does.
	d := startDaemon(t, harness.Config{Dir: ctrdDir, Address: address, Imports: []string{snippet}})
	ctx, cancel := context.WithTimeout(d.Context(context.Background()), ckTimeout)
	t.Cleanup(cancel)
	plugins, err := d.Client().IntrospectionService().Plugins(ctx, "id==cklite", "id==cklite-diff")
	if err != nil {
		t.Fatal(err)
	}
	if len(plugins.Plugins) != 2 {
		t.Fatalf("containerd lists %d of the snippet's plugins cklite and cklite-diff: %v", len(plugins.Plugins), plugins.Plugins)
	}
	img, err := d.ImportUnpacked(ctx, busybox, ckliteSnapshotter)
	if err != nil {
		t.Fatal(err)
	}
	e := &ckEnv{d: d, sn: d.Client().SnapshotService(ckliteSnapshotter), lm: d.Client().LeasesService(), img: img, ctx: ctx}
	c, _, cnt := e.startCounter(t, "on-existing")
	writeMarks(t, cnt.Rootfs, "existing")
	at := cnt.advance(t, 2)
	cklite(t, d, "checkpoint", "create", c.ID())
	recs := e.records(t)
	if len(recs) != 1 || recs[0].Snapshotter != ckliteSnapshotter {
		t.Fatalf("checkpoints %+v: want one, its layer frozen in %s", recs, ckliteSnapshotter)
	}
	cnt.advance(t, 2)
	changeMarks(t, cnt.Rootfs, "existing")
	cklite(t, d, "rollback", c.ID(), recs[0].ID)
	expectRolledBack(t, cnt, at, "existing")
	if err := d.Remove(ctx, c.ID()); err != nil {
		t.Fatal(err)
	}
}

// runCklite runs this checkout's cklite in dir with the stack on PATH, as a user who installed
// it would, and returns its standard output.
func runCklite(t *testing.T, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(stack.ProjectBin, "cklite"), args...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + stack.Path(), "HOME=" + dir}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("cklite %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}
