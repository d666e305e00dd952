//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cklite/cklite/snapshotter/freeze"
	"github.com/cklite/cklite/snapshotter/freeze/freezetest"
)

// TestRootfsCrash runs freeze.Rootfs through containerd's own metadata over this snapshotter and
// kills it after each of its changes (the calls of a dead process never happen). Whatever the
// moment, the container's record names a snapshot that exists and shows the container's file,
// also once every lease has expired and the collector has run; without a crash the container is on
// its own key again, empty, on the layer that holds the file. The layer has no gc.root: as a
// checkpoint's, it is held by the freeze's lease, and the checkpoint's only once the freeze is done.
func TestRootfsCrash(t *testing.T) {
	// The changes Rootfs makes, in order: prepare the borrower, commit it, prepare the fresh key,
	// update the container, hand over, remove the key, prepare the key, update the container (the
	// freeze is done: a crash after it only leaves the fresh key to the collector), remove the
	// fresh key; 10 is no crash.
	const done = 8
	for crash := 1; crash <= 10; crash++ {
		t.Run(string(rune('0'+crash%10)), func(t *testing.T) {
			ctx, backend, sn, cs, db := rootfsMeta(t)
			c := &crashAfter{n: crash}
			_, err := freeze.Rootfs(ctx, crashSn{sn, c}, crashCs{cs, c}, metadata.NewLeaseManager(db), "c1", "layer", map[string]string{"cklite.io/checkpoint": "ck"})
			if (err == nil) != (crash >= done) {
				t.Fatalf("Rootfs with a crash after change %d: %v", crash, err)
			}
			key := expectFile(ctx, t, sn, cs)
			lm := metadata.NewLeaseManager(db)
			all, err := lm.List(ctx)
			for _, l := range all {
				if err == nil {
					err = lm.Delete(ctx, l)
				}
			}
			if err == nil {
				_, err = db.GarbageCollect(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			if after := expectFile(ctx, t, sn, cs); after != key {
				t.Fatalf("the collector moved the container from %s to %s", key, after)
			}
			// Every snapshot left has its own directory: no upper is still lent.
			err = backend.Walk(ctx, func(ctx context.Context, info snapshots.Info) error {
				id := snapshotID(t, backend, info.Name)
				if _, lent := realUpper(backend.upperPath(id)); lent {
					t.Errorf("after the collector, %s's upper is still borrowed", info.Name)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if crash >= done {
				info, err := sn.Stat(ctx, key)
				if err != nil || key != "c1" || info.Parent != "layer" {
					t.Fatalf("after the freeze the container is on %s (%+v, %v), want c1 on layer", key, info, err)
				}
			}
		})
	}
}

// rootfsMeta is containerd's metadata over a cklite snapshotter, with container c1 on key c1 on
// a committed base, its upper holding a file f.
func rootfsMeta(t *testing.T) (context.Context, *Snapshotter, snapshots.Snapshotter, containers.Store, *metadata.DB) {
	t.Helper()
	backend := newTestSnapshotter(t)
	ctx := namespaces.WithNamespace(context.Background(), "test")
	db := freezetest.MetaDB(ctx, t, "cklite", backend)
	sn, cs := db.Snapshotter("cklite"), metadata.NewContainerStore(db)
	if _, err := sn.Prepare(ctx, "base-active", ""); err != nil {
		t.Fatal(err)
	}
	if err := sn.Commit(ctx, "base", "base-active", snapshots.WithLabels(map[string]string{"containerd.io/gc.root": "test"})); err != nil {
		t.Fatal(err)
	}
	mounts, err := sn.Prepare(ctx, "c1", "base")
	if err != nil {
		t.Fatal(err)
	}
	upper, err := freeze.UpperDir("c1", mounts)
	if err == nil {
		err = os.WriteFile(filepath.Join(upper, "f"), []byte("data"), 0o644)
	}
	if err == nil {
		_, err = cs.Create(ctx, containers.Container{ID: "c1", Snapshotter: "cklite", SnapshotKey: "c1",
			Runtime: containers.RuntimeInfo{Name: "io.containerd.cklite.v2"}, Spec: &anypb.Any{TypeUrl: "test/spec"}})
	}
	if err != nil {
		t.Fatal(err)
	}
	return ctx, backend, sn, cs, db
}

// expectFile checks that the key container c1's record names exists and its mount shows f, and
// returns it.
func expectFile(ctx context.Context, t *testing.T, sn snapshots.Snapshotter, cs containers.Store) string {
	t.Helper()
	ctr, err := cs.Get(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	mounts, err := sn.Mounts(ctx, ctr.SnapshotKey)
	if err != nil {
		t.Fatalf("the container's key %s: %v", ctr.SnapshotKey, err)
	}
	err = mount.WithReadonlyTempMount(ctx, mounts, func(root string) error {
		data, err := os.ReadFile(filepath.Join(root, "f"))
		if err == nil && string(data) != "data" {
			err = errors.New("f reads " + string(data))
		}
		return err
	})
	if err != nil {
		t.Fatalf("the container's key %s: %v", ctr.SnapshotKey, err)
	}
	return ctr.SnapshotKey
}

// crashAfter fails every call once n changes are made.
type crashAfter struct{ n, made int }

var errCrashed = errors.New("crashed")

// crashCall is one call of the crashing process: it never happens once the process is dead, and
// counts as a change once made if it is one.
func crashCall[T any](c *crashAfter, change bool, f func() (T, error)) (T, error) {
	if c.made >= c.n {
		var zero T
		return zero, errCrashed
	}
	if change {
		defer func() { c.made++ }()
	}
	return f()
}

// crashChange is crashCall for the calls that return only an error.
func crashChange(c *crashAfter, f func() error) error {
	_, err := crashCall(c, true, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

type crashSn struct {
	snapshots.Snapshotter
	c *crashAfter
}

func (s crashSn) Stat(ctx context.Context, key string) (snapshots.Info, error) {
	return crashCall(s.c, false, func() (snapshots.Info, error) { return s.Snapshotter.Stat(ctx, key) })
}

func (s crashSn) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	return crashCall(s.c, false, func() ([]mount.Mount, error) { return s.Snapshotter.Mounts(ctx, key) })
}

func (s crashSn) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return crashCall(s.c, true, func() ([]mount.Mount, error) { return s.Snapshotter.Prepare(ctx, key, parent, opts...) })
}

func (s crashSn) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	return crashChange(s.c, func() error { return s.Snapshotter.Commit(ctx, name, key, opts...) })
}

func (s crashSn) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (snapshots.Info, error) {
	return crashCall(s.c, true, func() (snapshots.Info, error) { return s.Snapshotter.Update(ctx, info, fieldpaths...) })
}

func (s crashSn) Remove(ctx context.Context, key string) error {
	return crashChange(s.c, func() error { return s.Snapshotter.Remove(ctx, key) })
}

type crashCs struct {
	containers.Store
	c *crashAfter
}

func (s crashCs) Get(ctx context.Context, id string) (containers.Container, error) {
	return crashCall(s.c, false, func() (containers.Container, error) { return s.Store.Get(ctx, id) })
}

func (s crashCs) Update(ctx context.Context, ctr containers.Container, fieldpaths ...string) (containers.Container, error) {
	return crashCall(s.c, true, func() (containers.Container, error) { return s.Store.Update(ctx, ctr, fieldpaths...) })
}
