package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cklite/cklite/pkg/ckimage"
)

// exampleReport is what integration/example prints.
type exampleReport struct {
	Sandbox    string    `json:"sandbox"`
	NetNS      [2]string `json:"netns"`
	Checkpoint string    `json:"checkpoint"`
	RolledBack string    `json:"rolledBack"`
	Forks      []string  `json:"forks"`
	Image      string    `json:"image"`
	Archive    string    `json:"archive"`
}

// TestClientExample is issue 18 item 3's "done when": the Go client's example (docs/client.md),
// compiled and run as an agent framework would run it, against this test's containerd: a sandbox,
// a step, a checkpoint, a bad action, a rollback in place, 4 forks, an export. What it reports is
// checked against containerd and the sandboxes' files.
func TestClientExample(t *testing.T) {
	expectExampleInDocs(t)
	e := newCkEnv(t)
	bin := filepath.Join(t.TempDir(), "example")
	build := exec.CommandContext(e.ctx, "go", "build", "-o", bin, "./example")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./example: %v\n%s", err, out)
	}
	out := t.TempDir()
	cmd := e.d.Command(e.ctx, "cklite") // the daemon's environment (shim configuration)
	cmd.Path, cmd.Args = bin, []string{bin, "-address", e.d.Address, "-namespace", e.d.Namespace, "-image", e.img.Name(), "-out", out}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("example: %v\n%s", err, stderr.String())
	}
	t.Logf("example printed:\n%s", stdout.String())
	var rep exampleReport
	if err := json.Unmarshal([]byte(stdout.String()), &rep); err != nil {
		t.Fatal(err)
	}

	// The rollback was in place: the same network namespace (and task), the step's files back,
	// the bad action undone.
	sandbox := procIdentity(t, e, rep.Sandbox)
	if !strings.HasPrefix(rep.NetNS[0], "net:[") || rep.NetNS[1] != rep.NetNS[0] || rep.RolledBack != "step1" {
		t.Fatalf("sandbox %s: network namespace %q before the checkpoint, %q after the rollback; /notes said %q, want step1",
			rep.Sandbox, rep.NetNS[0], rep.NetNS[1], rep.RolledBack)
	}
	if !strings.HasPrefix(sandbox, rep.NetNS[0]+"\n") {
		t.Fatalf("the sandbox's init is in %q, the example saw network namespace %q", sandbox, rep.NetNS[0])
	}
	expectFile(t, filepath.Join(e.d.RootfsPath(rep.Sandbox), "notes"), "step1\n")
	if _, err := os.Lstat(filepath.Join(e.d.RootfsPath(rep.Sandbox), "bin/ls")); err != nil {
		t.Fatalf("the bad action's rm /bin/ls was not rolled back: %v", err)
	}
	r := e.record(t, rep.Checkpoint)
	if r.Name != "step1" || r.Labels["agent.step"] != "1" || r.Container != rep.Sandbox {
		t.Fatalf("checkpoint %s: %+v, want name step1, label agent.step=1, container %s", rep.Checkpoint, r.Meta, rep.Sandbox)
	}

	// Four forks, each a sandbox of its own holding the step.
	if len(rep.Forks) != 4 {
		t.Fatalf("%d forks, want 4", len(rep.Forks))
	}
	seen := []string{sandbox}
	for _, id := range rep.Forks {
		ident := procIdentity(t, e, id)
		if slices.Contains(seen, ident) {
			t.Fatalf("fork %s runs in the cgroups and network namespace of another sandbox:\n%s", id, ident)
		}
		seen = append(seen, ident)
		expectFile(t, filepath.Join(e.d.RootfsPath(id), "notes"), "step1\n")
	}

	// The export: an image that names the checkpoint, and its archive.
	img, err := e.d.Client().ImageService().Get(e.ctx, rep.Image)
	if err != nil || img.Labels[ckimage.LabelCheckpoint] != rep.Checkpoint {
		t.Fatalf("image %s: %+v (%v), want one labelled %s=%s", rep.Image, img, err, ckimage.LabelCheckpoint, rep.Checkpoint)
	}
	if info, err := os.Stat(rep.Archive); err != nil || info.Size() == 0 || filepath.Dir(rep.Archive) != out {
		t.Fatalf("archive %s: %v, want a file in %s", rep.Archive, err, out)
	}
}

// expectFile checks that path holds want.
func expectFile(t *testing.T, path, want string) {
	t.Helper()
	if data, err := os.ReadFile(path); err != nil || string(data) != want {
		t.Fatalf("%s holds %q (%v), want %q", path, data, err, want)
	}
}

// expectExampleInDocs checks that docs/client.md shows the example's run function as it is.
func expectExampleInDocs(t *testing.T) {
	t.Helper()
	src, err := os.ReadFile("example/main.go")
	if err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile("../docs/client.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(src), "func run(")
	end := strings.Index(string(src)[start:], "\n}\n")
	if start < 0 || end < 0 || !strings.Contains(string(docs), string(src)[start:start+end+3]) {
		t.Fatal("docs/client.md does not show integration/example's run function as it is: copy it there")
	}
}
