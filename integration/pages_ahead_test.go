package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/pagechain"
)

// TestPagesMaterialisedAhead: the shim makes the restore copies of a checkpoint's compressed
// pages in the background (shim/pagededup.go) once its container has been rolled back in place,
// and not before. A busybox counter is checkpointed with `cklite checkpoint create`: its pages are
// compressed and no copy in the materialisation cache reads its directory until a rollback to it
// asks for one. Once rolled back, the container's next checkpoint has its copy when its
// deduplication report is written, and a rollback to it restores the counter through that copy.
func TestPagesMaterialisedAhead(t *testing.T) {
	e := newCkEnv(t)
	c, _, cnt := e.startCounter(t, "ahead")
	create := func() (id, dir string) {
		t.Helper()
		var v struct {
			ID        string `json:"id"`
			ImagePath string `json:"imagePath"`
		}
		if err := json.Unmarshal([]byte(cklite(t, e.d, "checkpoint", "create", "--format", "json", c.ID())), &v); err != nil {
			t.Fatal(err)
		}
		if r := waitReport(t, v.ImagePath); r.Compressed.Files == 0 {
			t.Fatalf("checkpoint %s: no pages file compressed (%+v): nothing to materialise", v.ID, r)
		}
		return v.ID, v.ImagePath
	}

	// Each checkpoint is taken with the counter held still at a count, and rolled back to once
	// the counter has gone past it.
	at := map[string]workload.Count{}
	checkpointAt := func() (string, string) {
		n := cnt.advance(t, 3)
		id, dir := create()
		at[id] = n
		return id, dir
	}
	rollBack := func(id string) {
		cnt.advance(t, 2)
		cklite(t, e.d, "rollback", c.ID(), id)
		cnt.expectRestored(t, at[id])
	}

	first, firstDir := checkpointAt()
	if n := copiesOf(t, firstDir); n != 0 {
		t.Fatalf("%d copies read the first checkpoint's directory before any restore, want none", n)
	}
	rollBack(first)
	if n := copiesOf(t, firstDir); n != 1 {
		t.Fatalf("%d copies read the first checkpoint's directory after a rollback to it, want 1", n)
	}
	second, secondDir := checkpointAt()
	if n := copiesOf(t, secondDir); n != 1 {
		t.Fatalf("%d copies read the directory of the checkpoint taken after a rollback, want 1 made ahead", n)
	}
	rollBack(second)
	if n := copiesOf(t, secondDir); n != 1 {
		t.Fatalf("%d copies read the second checkpoint's directory after a rollback to it, want the 1 made ahead", n)
	}
}

// copiesOf counts the copies in the materialisation cache whose inventory is image directory
// dir's.
func copiesOf(t *testing.T, dir string) int {
	t.Helper()
	entries, err := os.ReadDir(pagechain.CacheRoot)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "inventory.img")
	n := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue // being made or evicted
		}
		copyDir := filepath.Join(pagechain.CacheRoot, e.Name())
		if target, err := os.Readlink(filepath.Join(copyDir, "inventory.img")); err == nil && filepath.Join(copyDir, target) == want {
			n++
		}
	}
	return n
}
