package freeze

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/snapshots/native"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cklite/cklite/snapshotter/freeze/freezetest"
)

// meta is containerd's own metadata store (the one that decides what its collector frees) over a
// native snapshotter, with a container "c1" on snapshot "c1" stacked on "base", and "frozen", a
// committed layer on base to switch to.
type meta struct {
	db *metadata.DB
	sn snapshots.Snapshotter
	cs containers.Store
	lm leases.Manager
}

const gcRoot = "containerd.io/gc.root"

func newMeta(t *testing.T) (context.Context, meta) {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "test")
	nsn, err := native.NewSnapshotter(filepath.Join(t.TempDir(), "native"))
	if err != nil {
		t.Fatal(err)
	}
	db := freezetest.MetaDB(ctx, t, "native", nsn)
	m := meta{db: db, sn: db.Snapshotter("native"), cs: metadata.NewContainerStore(db), lm: metadata.NewLeaseManager(db)}
	for _, layer := range []struct{ name, parent string }{{"base", ""}, {"frozen", "base"}} {
		if _, err := m.sn.Prepare(ctx, layer.name+"-active", layer.parent); err != nil {
			t.Fatal(err)
		}
		if err := m.sn.Commit(ctx, layer.name, layer.name+"-active", snapshots.WithLabels(map[string]string{gcRoot: "now"})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.sn.Prepare(ctx, "c1", "base", snapshots.WithLabels(map[string]string{"app": "counter"})); err != nil {
		t.Fatal(err)
	}
	_, err = m.cs.Create(ctx, containers.Container{
		ID: "c1", Snapshotter: "native", SnapshotKey: "c1",
		Runtime: containers.RuntimeInfo{Name: "io.containerd.cklite.v1"},
		Spec:    &anypb.Any{TypeUrl: "test/spec"}, // never read
	})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, m
}

// crashAt makes every call of the switch fail, as calls of a dead process never happen, from
// the moment the named step (prepare, update, remove) has done its work.
type crashAt struct {
	step string
	dead bool
}

var errCrashed = errors.New("crashed")

func (c *crashAt) after(step string) {
	if step == c.step {
		c.dead = true
	}
}

type crashSnapshotter struct {
	snapshots.Snapshotter
	c *crashAt
}

func (s crashSnapshotter) Stat(ctx context.Context, key string) (snapshots.Info, error) {
	if s.c.dead {
		return snapshots.Info{}, errCrashed
	}
	return s.Snapshotter.Stat(ctx, key)
}

func (s crashSnapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	if s.c.dead {
		return nil, errCrashed
	}
	defer s.c.after("prepare")
	return s.Snapshotter.Prepare(ctx, key, parent, opts...)
}

func (s crashSnapshotter) Remove(ctx context.Context, key string) error {
	if s.c.dead {
		return errCrashed
	}
	defer s.c.after("remove")
	return s.Snapshotter.Remove(ctx, key)
}

type crashContainers struct {
	containers.Store
	c *crashAt
}

func (s crashContainers) Get(ctx context.Context, id string) (containers.Container, error) {
	if s.c.dead {
		return containers.Container{}, errCrashed
	}
	return s.Store.Get(ctx, id)
}

func (s crashContainers) Update(ctx context.Context, ctr containers.Container, fieldpaths ...string) (containers.Container, error) {
	if s.c.dead {
		return containers.Container{}, errCrashed
	}
	defer s.c.after("update")
	return s.Store.Update(ctx, ctr, fieldpaths...)
}

type crashLeases struct {
	leases.Manager
	c *crashAt
}

func (l crashLeases) Delete(ctx context.Context, lease leases.Lease, opts ...leases.DeleteOpt) error {
	if l.c.dead {
		return errCrashed
	}
	return l.Manager.Delete(ctx, lease, opts...)
}

// TestSwitchCrash kills a switch after each of its steps and checks what containerd is left
// with: the container's key exists, on the old parent or the new one, and survives the
// collector; once the leases of the dead switch expire, the collector leaves no snapshot but the
// container's and its parents'.
func TestSwitchCrash(t *testing.T) {
	for _, tc := range []struct {
		crash      string // the step after which the switch dies, "" for none
		wantParent string
		wantErr    bool // a switch that dies after the update has switched: only the removal failed
	}{
		{"", "frozen", false},
		{"prepare", "base", true},
		{"update", "frozen", false}, // Finish's removal finds the switch dead
	} {
		t.Run("crash after "+tc.crash, func(t *testing.T) {
			ctx, m := newMeta(t)
			c := &crashAt{step: tc.crash}
			sw, serr := Switch(ctx, crashSnapshotter{m.sn, c}, crashContainers{m.cs, c}, crashLeases{m.lm, c}, "c1", "frozen", nil)
			if (serr != nil) != tc.wantErr {
				t.Fatalf("switch: %v, want an error: %v", serr, tc.wantErr)
			}
			if serr == nil {
				sw.Finish(ctx)
			}
			key := rootfsOf(ctx, t, m)
			info, err := m.sn.Stat(ctx, key)
			if err != nil {
				t.Fatalf("the container refers to %s: %v", key, err)
			}
			if info.Parent != tc.wantParent || info.Labels["app"] != "counter" {
				t.Fatalf("the container's snapshot is %+v, want one on %s with the labels of c1", info, tc.wantParent)
			}
			if serr == nil && (sw.Key != key || len(sw.Mounts) == 0) {
				t.Fatalf("switch returned %+v, the container refers to %s", sw, key)
			}
			// The collector runs while the dead switch's lease still holds: the container's key
			// stays, whichever it is; then the lease expires.
			if _, err := m.db.GarbageCollect(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := m.sn.Stat(ctx, key); err != nil {
				t.Fatalf("the collector removed the container's key %s: %v", key, err)
			}
			expireLeases(ctx, t, m)
			if _, err := m.db.GarbageCollect(ctx); err != nil {
				t.Fatal(err)
			}
			if got, want := snapshotKeys(ctx, t, m), sorted("base", "frozen", key); !slices.Equal(got, want) {
				t.Fatalf("snapshots left: %v, want %v", got, want)
			}
		})
	}
}

// TestSwitchRepeated switches a container back and forth: keys do not grow, each switch removes
// the one before, and the key a crash left behind goes at the next switch.
func TestSwitchRepeated(t *testing.T) {
	ctx, m := newMeta(t)
	c := &crashAt{step: "update"}
	sw, err := Switch(ctx, crashSnapshotter{m.sn, c}, crashContainers{m.cs, c}, crashLeases{m.lm, c}, "c1", "frozen", nil)
	if err != nil {
		t.Fatal(err)
	}
	sw.Finish(ctx)
	if _, err := m.sn.Stat(ctx, "c1"); err != nil {
		t.Fatalf("the switch that died after the update left no c1 to remove: %v", err)
	}
	for i, parent := range []string{"base", "frozen", "base"} {
		before := rootfsOf(ctx, t, m)
		sw, err := Switch(ctx, m.sn, m.cs, m.lm, "c1", parent, nil)
		if err != nil {
			t.Fatal(err)
		}
		sw.Finish(ctx)
		info, err := m.sn.Stat(ctx, sw.Key)
		if err != nil || info.Parent != parent || info.Labels[LabelReplaces] != before || info.Labels["app"] != "counter" {
			t.Fatalf("switch %d: %s is %+v (%v), want it on %s replacing %s", i, sw.Key, info, err, parent, before)
		}
		if !strings.HasPrefix(sw.Key, "c1-") || len(sw.Key) != len("c1-")+8 {
			t.Fatalf("switch %d: key %q, want c1-<8 hex>", i, sw.Key)
		}
		if got := snapshotKeys(ctx, t, m); !slices.Equal(got, sorted("base", "frozen", sw.Key)) {
			t.Fatalf("switch %d: snapshots %v, want base, frozen and %s", i, got, sw.Key)
		}
	}
}

// TestSwitchFinishLater: until Finish, the container's former key stays (nothing refers to it)
// and the switch's lease holds; the labels given are set with the key, in one update; Finish
// removes the former key and ends the lease.
func TestSwitchFinishLater(t *testing.T) {
	ctx, m := newMeta(t)
	c := &countingContainers{Store: m.cs}
	sw, err := Switch(ctx, m.sn, c, m.lm, "c1", "frozen", map[string]string{"cklite.io/lineage": "a,b"})
	if err != nil {
		t.Fatal(err)
	}
	ctr, err := m.cs.Get(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if ctr.SnapshotKey != sw.Key || ctr.Labels["cklite.io/lineage"] != "a,b" || c.updates != 1 {
		t.Fatalf("container after the switch: key %s, labels %v, %d updates; want key %s, the lineage, one update", ctr.SnapshotKey, ctr.Labels, c.updates, sw.Key)
	}
	if got := snapshotKeys(ctx, t, m); !slices.Equal(got, sorted("base", "c1", "frozen", sw.Key)) {
		t.Fatalf("before Finish: snapshots %v, want c1 still there", got)
	}
	if l, err := m.lm.List(ctx); err != nil || len(l) != 1 {
		t.Fatalf("before Finish: leases %v (%v), want the switch's", l, err)
	}
	sw.Finish(ctx)
	if got := snapshotKeys(ctx, t, m); !slices.Equal(got, sorted("base", "frozen", sw.Key)) {
		t.Fatalf("after Finish: snapshots %v, want c1 removed", got)
	}
	if l, err := m.lm.List(ctx); err != nil || len(l) != 0 {
		t.Fatalf("after Finish: leases %v (%v), want none", l, err)
	}
}

// countingContainers counts the updates of the container store.
type countingContainers struct {
	containers.Store
	updates int
}

func (s *countingContainers) Update(ctx context.Context, ctr containers.Container, fieldpaths ...string) (containers.Container, error) {
	s.updates++
	return s.Store.Update(ctx, ctr, fieldpaths...)
}

func rootfsOf(ctx context.Context, t *testing.T, m meta) string {
	t.Helper()
	ctr, err := m.cs.Get(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	return ctr.SnapshotKey
}

// expireLeases deletes every lease, as their expiry would.
func expireLeases(ctx context.Context, t *testing.T, m meta) {
	t.Helper()
	all, err := m.lm.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range all {
		if err := m.lm.Delete(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
}

// snapshotKeys lists the snapshots of the namespace, sorted.
func snapshotKeys(ctx context.Context, t *testing.T, m meta) []string {
	t.Helper()
	var keys []string
	err := m.sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		keys = append(keys, info.Name)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return keys
}

func sorted(keys ...string) []string {
	slices.Sort(keys)
	return keys
}
