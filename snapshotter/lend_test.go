//go:build linux

package snapshotter

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/snapshotter/freeze"
)

// TestLendUpper: a container's upper lent to a borrower that is committed as a layer is one
// directory (same inode, nothing copied), which a snapshot on the layer shows; whichever way the
// lender goes (a hand-over by Update, its Remove, or its borrower removed first), the files end
// where they belong and nothing else is touched.
func TestLendUpper(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(ctx context.Context, s *Snapshotter) error
		// kept says whether the layer keeps the lender's files; otherwise the lender does.
		kept bool
	}{
		{name: "hand-over by update", kept: true, end: func(ctx context.Context, s *Snapshotter) error {
			if _, err := s.Update(ctx, snapshots.Info{Name: "ns/1/k", Labels: map[string]string{freeze.LabelHandOver: "f"}}, "labels."+freeze.LabelHandOver); err != nil {
				return err
			}
			return s.Remove(ctx, "ns/1/k")
		}},
		{name: "hand-over by remove", kept: true, end: func(ctx context.Context, s *Snapshotter) error {
			return s.Remove(ctx, "ns/1/k")
		}},
		{name: "borrower removed first", kept: false, end: func(ctx context.Context, s *Snapshotter) error {
			if err := s.Remove(ctx, "ns/3/top"); err != nil {
				return err
			}
			return s.Remove(ctx, "ns/2/f")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSnapshotter(t)
			ctx := context.Background()
			upper := lentLayer(t, s)
			ino := inode(t, upper)
			if err := tc.end(ctx, s); err != nil {
				t.Fatal(err)
			}
			var dir string
			if tc.kept {
				dir = s.upperPath(snapshotID(t, s, "ns/2/f"))
				if _, err := s.Stat(ctx, "ns/1/k"); !errdefs.IsNotFound(err) {
					t.Fatalf("the lender after its removal: %v", err)
				}
			} else {
				dir = upper
			}
			if got := inode(t, dir); got != ino {
				t.Fatalf("%s is inode %d, the lent upper was %d", dir, got, ino)
			}
			if data, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(data) != "data" {
				t.Fatalf("the lent file in %s: %q %v", dir, data, err)
			}
		})
	}
}

// lentLayer makes, in namespace ns of s, an active snapshot k on base holding a file f, lends its
// upper to a borrower committed as f, and prepares top on f, whose mount shows the file. It
// returns k's upper.
func lentLayer(t *testing.T, s *Snapshotter) string {
	t.Helper()
	ctx := context.Background()
	for _, step := range []func() error{
		func() error { _, err := s.Prepare(ctx, "ns/0/b", ""); return err },
		func() error { return s.Commit(ctx, "ns/0/base", "ns/0/b") },
		func() error { _, err := s.Prepare(ctx, "ns/1/k", "ns/0/base"); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	upper := upperOf(t, s, "ns/1/k")
	if err := os.WriteFile(filepath.Join(upper, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, "ns/2/borrower", "ns/0/base", snapshots.WithLabels(map[string]string{freeze.LabelUpperOf: upper})); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "ns/2/f", "ns/2/borrower"); err != nil {
		t.Fatal(err)
	}
	if u, err := s.Usage(ctx, "ns/2/f"); err != nil || u.Inodes != 2 {
		t.Fatalf("usage of the layer on a lent upper: %+v %v, want 2 inodes", u, err)
	}
	mounts, err := s.Prepare(ctx, "ns/3/top", "ns/2/f")
	if err != nil {
		t.Fatal(err)
	}
	err = mount.WithReadonlyTempMount(ctx, mounts, func(root string) error {
		data, err := os.ReadFile(filepath.Join(root, "f"))
		if err == nil && string(data) != "data" {
			t.Errorf("the layer on a lent upper shows f = %q", data)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return upper
}

func snapshotID(t *testing.T, s *Snapshotter, key string) string {
	t.Helper()
	var id string
	err := s.ms.WithTransaction(context.Background(), false, func(ctx context.Context) (err error) {
		id, _, _, err = storage.GetInfo(ctx, key)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestLendRefused: only an unmounted active snapshot on the same parent, in the same namespace,
// lends its upper; a mounted lender is not handed over either.
func TestLendRefused(t *testing.T) {
	s := newTestSnapshotter(t)
	ctx := context.Background()
	upper := lentLayer(t, s)
	if _, err := s.Prepare(ctx, "ns/4/c", "ns/0/base"); err != nil {
		t.Fatal(err)
	}
	cUpper := upperOf(t, s, "ns/4/c")
	for _, tc := range []struct {
		name, key, parent, upper string
		want                     func(error) bool
	}{
		{"other parent", "ns/5/x", "ns/2/f", cUpper, errdefs.IsFailedPrecondition},
		{"other namespace", "other/5/x", "ns/0/base", cUpper, errdefs.IsPermissionDenied},
		{"committed", "ns/5/x", "", s.upperPath(snapshotID(t, s, "ns/0/base")), errdefs.IsFailedPrecondition},
		{"not a snapshot's upper", "ns/5/x", "ns/0/base", t.TempDir(), errdefs.IsInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Prepare(ctx, tc.key, tc.parent, snapshots.WithLabels(map[string]string{freeze.LabelUpperOf: tc.upper}))
			if !tc.want(err) {
				t.Fatalf("got %v", err)
			}
		})
	}
	mounts, err := s.Mounts(ctx, "ns/1/k")
	if err != nil {
		t.Fatal(err)
	}
	target := t.TempDir()
	if err := mount.All(mounts, target); err != nil {
		t.Fatal(err)
	}
	defer mount.UnmountAll(target, 0) //nolint:errcheck
	if err := s.Remove(ctx, "ns/1/k"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("removing a mounted lender: %v, want a refusal", err)
	}
	if _, err := s.Prepare(ctx, "ns/5/x", "ns/0/base", snapshots.WithLabels(map[string]string{freeze.LabelUpperOf: upper})); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("lending a mounted upper: %v, want a refusal", err)
	}
}
