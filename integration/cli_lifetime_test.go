package integration

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
)

// TestCLILifetime is issue 18 item 5's policy (docs/cli.md, lifetime): a container's checkpoints
// outlive it, and `checkpoint prune --orphaned` removes those whose container is gone and that no
// container descends from, with their image directories in containerd's checkpoints directory.
// web's checkpoint is forked, solo's is not; both containers are removed: solo's checkpoint goes
// with the first prune, web's only once its fork is gone too.
func TestCLILifetime(t *testing.T) {
	e := newCkEnv(t)
	e.startCounter(t, "web")
	e.startCounter(t, "solo")
	web := e.cliCheckpoint(t, "web")
	solo := e.cliCheckpoint(t, "solo")
	forkID := strings.TrimSpace(cklite(t, e.d, "fork", "-q", "--prefix", "try", web.ID))
	e.removeContainer(t, "web")
	e.removeContainer(t, "solo")

	if ids := recordIDs(e.records(t)); !slices.Equal(ids, []string{web.ID, solo.ID}) {
		t.Fatalf("after their containers were removed, the checkpoints are %v; want both kept", ids)
	}
	rows := lsRows(t, cklite(t, e.d, "checkpoint", "ls"))
	if len(rows) != 2 || !strings.HasSuffix(rows[0], "◀ try-1") || strings.Fields(rows[1])[2] != "solo" {
		t.Fatalf("checkpoint ls:\n%s\nwant web's checkpoint marked as the fork's state, solo's named by its container's id", strings.Join(rows, "\n"))
	}

	var dry []struct {
		ID       string `json:"id"`
		Removed  bool   `json:"removed"`
		ImageDir string `json:"imageDir"`
	}
	if err := json.Unmarshal([]byte(cklite(t, e.d, "checkpoint", "prune", "--orphaned", "--dry-run", "--format", "json")), &dry); err != nil {
		t.Fatal(err)
	}
	if len(dry) != 2 || dry[0].ID != solo.ID || dry[0].Removed || dry[0].ImageDir != "" || dry[1].ImageDir != solo.ImagePath {
		t.Fatalf("prune --orphaned --dry-run: %+v; want solo's checkpoint %s and its image directory %s, nothing removed", dry, solo.ID, solo.ImagePath)
	}
	if out := cklite(t, e.d, "checkpoint", "prune", "--orphaned", "--gc", "-q"); out != solo.ID+"\n" {
		t.Fatalf("prune --orphaned -q printed %q, want solo's checkpoint %s", out, solo.ID)
	}
	if ids := recordIDs(e.records(t)); !slices.Equal(ids, []string{web.ID}) {
		t.Fatalf("after prune --orphaned the checkpoints are %v, want web's, which the fork descends from", ids)
	}
	expectGone(t, solo.ImagePath)
	if _, err := e.sn.Stat(e.ctx, solo.Frozen); !errdefs.IsNotFound(err) {
		t.Fatalf("solo's frozen layer after prune --orphaned --gc: %v, want it collected", err)
	}

	e.removeContainer(t, forkID)
	cklite(t, e.d, "checkpoint", "prune", "--orphaned", "--gc")
	if ids := recordIDs(e.records(t)); len(ids) != 0 {
		t.Fatalf("with the fork gone too, prune --orphaned left %v", ids)
	}
	expectGone(t, web.ImagePath)
}

// cliCheckpoint checkpoints container with `cklite checkpoint create` into containerd's
// checkpoints directory and returns what inspect says of it.
func (e *ckEnv) cliCheckpoint(t *testing.T, container string) inspected {
	t.Helper()
	id := strings.TrimSpace(cklite(t, e.d, "checkpoint", "create", "-q", container))
	var got []inspected
	if err := json.Unmarshal([]byte(cklite(t, e.d, "checkpoint", "inspect", id)), &got); err != nil || len(got) != 1 || got[0].ImagePath == "" {
		t.Fatalf("inspect %s: %+v (%v)", id, got, err)
	}
	return got[0]
}

// removeContainer kills container id's task and removes it with its rootfs snapshot.
func (e *ckEnv) removeContainer(t *testing.T, id string) {
	t.Helper()
	c, err := e.d.Client().LoadContainer(e.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	e.deleteTask(t, c)
	if err := c.Delete(e.ctx, client.WithSnapshotCleanup); err != nil {
		t.Fatalf("remove container %s: %v", id, err)
	}
}

func expectGone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is still there (%v)", path, err)
	}
}

// cliLeftovers is what a cklite command may leave behind.
type cliLeftovers struct {
	Checkpoints, Leases, ImageDirs, Images, Snapshots, Containers []string
}

func (e *ckEnv) cliLeftovers(t *testing.T, dirs ...string) cliLeftovers {
	t.Helper()
	var l cliLeftovers
	l.Checkpoints = recordIDs(e.records(t))
	l.Leases = e.leaseIDs(t)
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		for _, en := range entries {
			l.ImageDirs = append(l.ImageDirs, filepath.Join(dir, en.Name()))
		}
	}
	imgs, err := e.d.Client().ImageService().List(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		l.Images = append(l.Images, img.Name)
	}
	l.Snapshots = e.snapshotNames(t)
	l.Containers = containerIDs(t, e)
	return l
}

// TestCLIFailedLeaveNothing is issue 18 item 5's other half: each command that fails leaves the
// checkpoints, leases, image directories, images, snapshots and containers as they were.
func TestCLIFailedLeaveNothing(t *testing.T) {
	e := newCkEnv(t)
	e.startCounter(t, "web")
	good := e.cliCheckpoint(t, "web")
	plain := newBusyboxContainer(t, e.ctx, e.d, runcRuntime, "plain", counterSpec)
	if _, err := startTask(e.ctx, plain); err != nil {
		t.Fatal(err)
	}
	corrupt := filepath.Join(t.TempDir(), "corrupt")
	if out, err := exec.Command("cp", "-a", good.ImagePath, corrupt).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(corrupt, "cklite.json"), []byte(`{"format": 1, "id": `), 0o600); err != nil {
		t.Fatal(err)
	}
	dirs := []string{filepath.Dir(good.ImagePath), filepath.Dir(corrupt)}
	before := e.cliLeftovers(t, dirs...)

	for _, tc := range []struct {
		name string
		args []string
		exit int
		says string
	}{
		{"checkpoint of a runc container", []string{"checkpoint", "create", "--name", "x", "plain"}, 1, "container plain runs on " + runcRuntime},
		{"checkpoint into a non-empty directory", []string{"checkpoint", "create", "--image-path", good.ImagePath, "web"}, 1, "not empty"},
		{"export of a corrupt cklite.json", []string{"checkpoint", "export", "--ref", "localhost/cklite/bad:1", "-o", filepath.Join(corrupt, "x.tar"), corrupt}, 1, "is corrupt"},
		{"fork of a corrupt cklite.json", []string{"fork", "--image-path", corrupt}, 1, "is corrupt"},
		{"rollback to a corrupt cklite.json", []string{"rollback", "--image-path", corrupt, "web"}, 1, "is corrupt"},
		{"export -o to an unwritable path", []string{"checkpoint", "export", "--ref", "localhost/cklite/web:good", "-o", filepath.Join(e.d.Dir, "no-such-dir", "ck.tar"), good.ID}, 1, "archive: open"},
		{"export --ref not in full", []string{"checkpoint", "export", "--ref", "web:good", good.ID}, 2, "nerdctl would look it up as docker.io/library/web:good"},
		{"export --ref that is no reference", []string{"checkpoint", "export", "--ref", "localhost/web good:1", good.ID}, 2, `image reference "localhost/web good:1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if out := ckliteExits(t, e.d, tc.exit, tc.says, tc.args...); out != "" {
				t.Errorf("printed %q on stdout", out)
			}
			after := e.cliLeftovers(t, dirs...)
			if a, b := jsonOf(t, after), jsonOf(t, before); a != b {
				t.Fatalf("left behind:\n%s\nwas:\n%s", a, b)
			}
		})
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
