// Package freezetest is what tests of freezes and switches share: containerd's own metadata
// store (the one whose collector decides what is freed) over a snapshotter under test.
package freezetest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins/content/local"
	bolt "go.etcd.io/bbolt"
)

// MetaDB opens containerd's metadata in a temporary directory of t, with sn as snapshotter name.
func MetaDB(ctx context.Context, t testing.TB, name string, sn snapshots.Snapshotter) *metadata.DB {
	t.Helper()
	dir := t.TempDir()
	cstore, err := local.NewStore(filepath.Join(dir, "content"))
	if err != nil {
		t.Fatal(err)
	}
	bdb, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bdb.Close() })
	db := metadata.NewDB(bdb, cstore, map[string]snapshots.Snapshotter{name: sn})
	if err := db.Init(ctx); err != nil {
		t.Fatal(err)
	}
	return db
}
