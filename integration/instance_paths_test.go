package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/paths"
)

// TestInstancePaths runs two containerds on one host as two alike-configured containerds would
// be: the same namespace name and the same cklite state directory. Each keeps its checkpoints'
// image directories and its checkpoint image cache in a directory of its own, named by its UUID:
// neither sees the other's, and the CLI and the shims agree on where they are.
func TestInstancePaths(t *testing.T) {
	skipUnbuiltShim(t, harness.CkliteRuntime)
	ns := "instances-" + randomTag()
	a := instanceEnv(t, harness.Config{CkliteSnapshotter: true, Namespace: ns})
	b := instanceEnv(t, harness.Config{CkliteSnapshotter: true, Namespace: ns, StateDir: a.d.StateDir})
	envs := []*ckEnv{a, b}

	var insts []paths.Instance
	var records []checkpoint.Record
	for i, e := range envs {
		inst, err := e.d.Instance(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		insts = append(insts, inst)
		// Container ids differ: a namespace's cgroups (/<namespace>/<id>) are the host's.
		c, _, _ := e.startCounter(t, "agent-"+string(rune('a'+i)))
		cklite(t, e.d, "checkpoint", "create", c.ID())
		recs := e.records(t)
		if len(recs) != 1 {
			t.Fatalf("daemon %d lists %d checkpoints, want its own one", i, len(recs))
		}
		records = append(records, recs[0])

		// The CLI finds the same directories as the harness does from containerd's UUID.
		var p struct {
			UUID        string `json:"uuid"`
			Checkpoints string `json:"checkpoints"`
			ImageCache  string `json:"image_cache"`
		}
		if err := json.Unmarshal([]byte(cklite(t, e.d, "paths", "--format", "json")), &p); err != nil {
			t.Fatal(err)
		}
		want, _ := inst.NamespaceCheckpoints(ns)
		if p.UUID != inst.UUID || p.Checkpoints != want || p.ImageCache != inst.ImageCache() {
			t.Fatalf("cklite paths of daemon %d: %+v, want uuid %s, checkpoints %s, image cache %s", i, p, inst.UUID, want, inst.ImageCache())
		}
	}
	if insts[0].UUID == insts[1].UUID || insts[0].Dir == insts[1].Dir {
		t.Fatalf("two containerds share instance %+v", insts[0])
	}
	for i, inst := range insts {
		dir, _ := inst.NamespaceCheckpoints(ns)
		if got, want := listDir(t, dir), []string{filepath.Base(records[i].ImagePath)}; !slices.Equal(got, want) || filepath.Dir(records[i].ImagePath) != dir {
			t.Fatalf("daemon %d: checkpoint in %s; %s holds %q, want only %q", i, records[i].ImagePath, dir, got, want)
		}
	}

	// A's checkpoint as an image, restored in A and then, through an archive, in B: each shim
	// extracts the CRIU images into its own containerd's cache.
	ref := "localhost/cklite/instances:" + records[0].ID
	archive := filepath.Join(a.d.Dir, "checkpoint.tar")
	cklite(t, a.d, "checkpoint", "export", "--ref", ref, "-o", archive, records[0].ID)
	img, blob := a.expectCheckpointImage(t, ref, 1)
	unpack(t, a, img)
	a.restoreFromImage(t, "restored-a", img)
	cached := blob.Digest.Encoded()
	if got := listDir(t, insts[0].ImageCache()); !slices.Equal(got, []string{cached}) {
		t.Fatalf("A's image cache holds %q, want %s", got, cached)
	}
	if got := listDir(t, insts[1].ImageCache()); len(got) != 0 {
		t.Fatalf("B's image cache holds %q after a restore in A", got)
	}
	cklite(t, b.d, "checkpoint", "import", "--snapshotter", ckliteSnapshotter, archive)
	imported, err := b.d.Client().GetImage(b.ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	b.restoreFromImage(t, "restored-b", imported)
	if got := listDir(t, insts[1].ImageCache()); !slices.Equal(got, []string{cached}) {
		t.Fatalf("B's image cache holds %q, want its own copy %s", got, cached)
	}

	// The daemons share cgroups by namespace: each one's containers go before either is torn down.
	for _, e := range envs {
		containers, err := e.d.Client().Containers(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range containers {
			if err := e.d.Remove(e.ctx, c.ID()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// instanceEnv is a ckEnv on a daemon started with cfg: busybox unpacked into cklite.
func instanceEnv(t *testing.T, cfg harness.Config) *ckEnv {
	t.Helper()
	d := startDaemon(t, cfg)
	ctx, cancel := context.WithTimeout(d.Context(context.Background()), ckTimeout)
	t.Cleanup(cancel)
	img, err := d.ImportUnpacked(ctx, busybox, ckliteSnapshotter)
	if err != nil {
		t.Fatal(err)
	}
	return &ckEnv{d: d, sn: d.Client().SnapshotService(ckliteSnapshotter), lm: d.Client().LeasesService(), img: img, ctx: ctx}
}

// listDir lists the names in dir that are not hidden (locks, work in progress); a missing dir
// holds none.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	return names
}
