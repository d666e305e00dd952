package shim

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// TestCheckpointLineage: the container's lineage names a checkpoint once it is listed, whether
// the lineage was recorded beside the lease or before it (beside CRIU's dump); a checkpoint that
// is not listed, its lease refused or a step before it failed, leaves the lineage as it was.
func TestCheckpointLineage(t *testing.T) {
	before := checkpoint.Lineage{"a", "b"}
	leaseErr := errors.New("containerd refused the lease")
	for _, tc := range []struct {
		name     string
		beside   bool  // recorded beside the dump, before the listing
		list     bool  // the checkpoint gets as far as its listing
		leaseErr error // what the listing fails with
		want     checkpoint.Lineage
	}{
		{name: "listed", list: true, want: checkpoint.Lineage{"new", "a", "b"}},
		{name: "listed, lineage beside the dump", beside: true, list: true, want: checkpoint.Lineage{"new", "a", "b"}},
		{name: "lease refused", list: true, leaseErr: leaseErr, want: before},
		{name: "lease refused, lineage beside the dump", beside: true, list: true, leaseErr: leaseErr, want: before},
		{name: "failed before the listing", beside: true, want: before},
		{name: "failed before anything", want: before},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := namespaces.WithNamespace(context.Background(), "ns")
			d := &fakeDaemon{lineages: map[string]checkpoint.Lineage{"c": before}}
			ck := &checkpointRun{s: &service{daemon: d}, c: &container{id: "c"}, opts: &options.CheckpointOptions{},
				path: t.TempDir(), t: newSteps(), lm: fakeLeases{createErr: tc.leaseErr}}
			meta := checkpoint.Meta{ID: "new", Container: "c", Lineage: before.String()}
			if tc.beside {
				ck.startDescend(ctx, meta)
			}
			if tc.list {
				if err := ck.list(ctx, meta); !errors.Is(err, tc.leaseErr) || tc.leaseErr == nil && err != nil {
					t.Fatalf("list: %v, want %v", err, tc.leaseErr)
				}
			}
			ck.undescend(ctx)
			if got := d.lineages["c"]; !slices.Equal(got, tc.want) {
				t.Fatalf("lineage %v, want %v", got, tc.want)
			}
		})
	}
}
