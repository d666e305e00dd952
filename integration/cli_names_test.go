package integration

// TestCLINamesAndJSON is issue 18 items 1 and 2, as a script would use cklite: a nerdctl
// container by its name and by an id prefix, checkpoints by the names and labels given them, and
// the JSON of every command that acts on a checkpoint, fork or rollback.

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/client"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
)

// jsonCheckpoint is a checkpoint as create, ls, inspect and rm print it with --format json.
type jsonCheckpoint struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Container   string            `json:"container"`
	Parent      string            `json:"parent"`
	Labels      map[string]string `json:"labels"`
	MemoryBytes int64             `json:"memoryBytes"`
	ImagePath   string            `json:"imagePath"`
	Filesystem  *struct {
		Bytes int64 `json:"bytes"`
	} `json:"filesystem"`
	TookMs int64 `json:"tookMs"`
}

// ckliteJSON runs cklite with args and decodes its standard output into v.
func ckliteJSON(t *testing.T, d *harness.Daemon, v any, args ...string) {
	t.Helper()
	out := cklite(t, d, args...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("cklite %s printed no JSON for %T: %v\n%s", strings.Join(args, " "), v, err, out)
	}
}

var shortID = regexp.MustCompile(`^[0-9a-f]{12}$`)

func TestCLINamesAndJSON(t *testing.T) {
	e := newCkEnv(t)
	id := runDetached(t, e.d, harness.CkliteRuntime, "agent", []string{"--snapshotter", ckliteSnapshotter}, "sh", "-c", workload.CounterScript)
	waitForStatus(t, e.d, "agent", "running")

	var first jsonCheckpoint
	ckliteJSON(t, e.d, &first, "checkpoint", "create", "--format", "json", "--name", "step1", "--label", "run=7", "agent")
	if !shortID.MatchString(first.ID) || first.Name != "step1" || first.Container != id || first.Labels["run"] != "7" ||
		first.MemoryBytes == 0 || first.Filesystem == nil || first.TookMs <= 0 || first.ImagePath == "" {
		t.Fatalf("checkpoint create --format json of agent: %+v; want its id, name step1, container %s, label run=7, sizes and time", first, id)
	}

	// By unique id prefix, ids only.
	second := strings.TrimSpace(cklite(t, e.d, "checkpoint", "create", "-q", "--name", "step2", id[:8]))
	if !shortID.MatchString(second) {
		t.Fatalf("checkpoint create -q printed %q, want the id alone", second)
	}
	if ids := strings.Fields(cklite(t, e.d, "checkpoint", "ls", "-q")); len(ids) != 2 || ids[1] != second {
		t.Fatalf("checkpoint ls -q printed %v, want the newest, %s, last", ids, second)
	}
	ckliteFails(t, e.d, "has a checkpoint named step1 already ("+first.ID+")", "checkpoint", "create", "--name", "step1", "agent")

	t.Run("ls selects by label and container", func(t *testing.T) {
		var got []jsonCheckpoint
		ckliteJSON(t, e.d, &got, "checkpoint", "ls", "--format", "json", "--label", "run=7")
		if len(got) != 1 || got[0].ID != first.ID {
			t.Fatalf("checkpoint ls --label run=7: %+v, want %s alone", got, first.ID)
		}
		ckliteJSON(t, e.d, &got, "checkpoint", "ls", "--format", "json", "--container", "agent")
		if len(got) != 2 || got[1].ID != second || got[1].Parent != first.ID || got[1].Name != "step2" {
			t.Fatalf("checkpoint ls --container agent: %+v, want %s, then %s (step2) on it", got, first.ID, second)
		}
	})

	t.Run("inspect by name", func(t *testing.T) {
		var got []jsonCheckpoint
		ckliteJSON(t, e.d, &got, "checkpoint", "inspect", "step2", "run=7")
		if len(got) != 2 || got[0].ID != second || got[1].ID != first.ID {
			t.Fatalf("checkpoint inspect step2 run=7: %+v, want %s and %s", got, second, first.ID)
		}
	})

	t.Run("rollback by names", func(t *testing.T) {
		// Written from the host: a nerdctl exec after a checkpoint is another matter.
		bad := filepath.Join(e.d.RootfsPath(id), "tmp", "bad")
		if err := os.WriteFile(bad, []byte("oops"), 0o644); err != nil {
			t.Fatal(err)
		}
		var got struct {
			Container, ContainerName, Checkpoint, CheckpointName string
			TookMs                                               int64
		}
		ckliteJSON(t, e.d, &got, "rollback", "--format", "json", "agent", "step1")
		if got.Container != id || got.ContainerName != "agent" || got.Checkpoint != first.ID || got.CheckpointName != "step1" || got.TookMs <= 0 {
			t.Fatalf("rollback --format json agent step1: %+v", got)
		}
		if _, err := os.Stat(bad); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("/tmp/bad, written after step1, is still there after the rollback to it")
		}
	})

	t.Run("fork by label", func(t *testing.T) {
		var got []struct {
			ID, Name, Checkpoint, CheckpointName string
			TookMs                               int64
			Failed                               bool
		}
		ckliteJSON(t, e.d, &got, "fork", "-n", "2", "--format", "json", "run=7")
		if len(got) != 2 {
			t.Fatalf("fork -n 2 --format json printed %d forks: %+v", len(got), got)
		}
		var names []string
		for _, f := range got {
			if len(f.ID) != 64 || f.Checkpoint != first.ID || f.CheckpointName != "step1" || f.Failed || f.TookMs <= 0 {
				t.Fatalf("fork: %+v", f)
			}
			names = append(names, f.Name)
		}
		t.Cleanup(func() { e.d.Nerdctl(e.ctx, append([]string{"rm", "-f"}, names...)...) }) //nolint:errcheck
		for _, f := range got {
			c, err := e.d.Client().LoadContainer(e.ctx, f.ID)
			if err != nil {
				t.Fatalf("fork %s: %v", f.Name, err)
			}
			task, err := c.Task(e.ctx, nil)
			if err != nil {
				t.Fatalf("fork %s: %v", f.Name, err)
			}
			e.expectStatus(t, task, client.Running, "fork "+f.Name)
		}
	})

	t.Run("rm by name", func(t *testing.T) {
		var got []jsonCheckpoint
		ckliteJSON(t, e.d, &got, "checkpoint", "rm", "--format", "json", "step2")
		if len(got) != 1 || got[0].ID != second || got[0].Name != "step2" {
			t.Fatalf("checkpoint rm --format json step2: %+v", got)
		}
		if ids := strings.Fields(cklite(t, e.d, "checkpoint", "ls", "-q")); !slices.Equal(ids, []string{first.ID}) {
			t.Fatalf("after rm step2: %v", ids)
		}
	})

	t.Run("ambiguous and unknown", func(t *testing.T) {
		e.newContainer(t, "abc1", e.img, counterSpec)
		e.newContainer(t, "abc2", e.img, counterSpec)
		ckliteFails(t, e.d, `container id prefix "abc" is ambiguous in namespace `+e.d.Namespace+": it matches abc1, abc2", "checkpoint", "create", "abc")
		ckliteFails(t, e.d, `no container "nobody"`, "rollback", "nobody", "step1")
		ckliteMisuse(t, e.d, "exclude each other", "checkpoint", "ls", "-q", "--format", "json")
	})
}

// TestCLISnapshotterDown is issue 18 item 8: with cklite-snapshotter stopped, a command that needs
// it fails with one sentence naming its socket, and checkpoint ls lists the checkpoints with one
// warning, not one a checkpoint.
func TestCLISnapshotterDown(t *testing.T) {
	e := newCkEnv(t)
	e.startCounter(t, "web")
	for range 2 {
		cklite(t, e.d, "checkpoint", "create", "-q", "web")
	}
	if err := e.d.StopSnapshotter(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.d.StartSnapshotter(); err != nil {
			t.Error(err)
		}
	})
	says := "cklite-snapshotter is not reachable at " + e.d.SnapshotterAddress + "; is it running?"

	cmd := e.d.Command(e.ctx, "cklite", "--address", e.d.Address, "-n", e.d.Namespace, "checkpoint", "ls")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("checkpoint ls with the snapshotter down: %v\n%s", err, stderr.String())
	}
	t.Logf("checkpoint ls with the snapshotter down:\n%s%s", stdout.String(), stderr.String())
	if rows := lsRows(t, stdout.String()); len(rows) != 2 {
		t.Fatalf("checkpoint ls listed %d checkpoints with the snapshotter down, want 2:\n%s", len(rows), stdout.String())
	}
	if n := strings.Count(stderr.String(), says); n != 1 || strings.Count(stderr.String(), "\n") != 1 {
		t.Fatalf("checkpoint ls warned %d times that %q; want one line:\n%s", n, says, stderr.String())
	}

	out := ckliteFails(t, e.d, says, "checkpoint", "create", "web")
	if out != "" {
		t.Fatalf("a failed checkpoint printed %q", out)
	}
}
