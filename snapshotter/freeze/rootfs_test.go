package freeze

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRootfsWithoutLending: a snapshotter that ignores LabelUpperOf (here containerd's native one)
// gets the freeze of old, Commit and Prepare of the key, and the files are the layer's; the
// borrower that borrowed nothing is removed.
func TestRootfsWithoutLending(t *testing.T) {
	ctx, m := newMeta(t)
	mounts, err := m.sn.Mounts(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	upper, err := UpperDir("c1", mounts)
	if err == nil {
		err = os.WriteFile(filepath.Join(upper, "f"), []byte("data"), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	key, err := Rootfs(ctx, m.sn, m.cs, m.lm, "c1", "layer", map[string]string{gcRoot: "test"})
	if err != nil || key != "c1" {
		t.Fatalf("Rootfs: %s, %v; want c1", key, err)
	}
	if info, err := m.sn.Stat(ctx, "c1"); err != nil || info.Parent != "layer" {
		t.Fatalf("c1 after the freeze: %+v, %v; want it on layer", info, err)
	}
	view, err := m.sn.View(ctx, "layer-view", "layer")
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(view[0].Source, "f")); err != nil || string(data) != "data" {
		t.Fatalf("the layer's f: %q, %v", data, err)
	}
	if _, err := m.sn.Stat(ctx, "cklite/freezing/layer"); err == nil {
		t.Fatal("the borrower that borrowed nothing is still there")
	}
}
