package checkpoint

import (
	"context"
	"testing"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/cklite/cklite/snapshotter/freeze/freezetest"
)

// TestFind asks containerd's own lease store (its filters decide the candidates) what
// TestLookup asks a Tree of the same checkpoints, and wants the same answers; among them, leases
// that are not checkpoints and a label value that filter syntax must quote.
func TestFind(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "ns")
	lm := metadata.NewLeaseManager(freezetest.MetaDB(ctx, t, "native", nil))
	records := lookupRecords()
	odd := rec("555555555555", "", 5)
	odd.Labels = map[string]string{"q": `a "quoted", b\c`}
	for _, r := range append(records, odd) {
		if _, err := Hold(ctx, lm, r); err != nil {
			t.Fatal(err)
		}
	}
	// Not checkpoints: a lease whose id starts like one but has no checkpoint label, and
	// one with a checkpoint's name label only.
	for _, l := range []struct {
		id     string
		labels map[string]string
	}{{LeaseID("0123aaaaaaaa"), nil}, {"other", map[string]string{LabelName: "only"}}} {
		if _, err := lm.Create(ctx, leases.WithID(l.id), leases.WithLabels(l.labels)); err != nil {
			t.Fatal(err)
		}
	}
	cases := append(lookupCases, lookupCase{id: `q=a "quoted", b\c`, want: "555555555555"})
	for _, tc := range cases {
		t.Run(tc.id, func(t *testing.T) {
			r, err := Find(ctx, lm, "ns", tc.id)
			tc.check(t, r.ID, err)
			if err == nil && r.Namespace != "ns" {
				t.Fatalf("Find(%q) read namespace %q, want ns", tc.id, r.Namespace)
			}
		})
	}
}

// TestNamed wants the checkpoint of one container with one name, not those of the same name of
// other containers.
func TestNamed(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "ns")
	lm := metadata.NewLeaseManager(freezetest.MetaDB(ctx, t, "native", nil))
	for _, r := range lookupRecords() {
		if _, err := Hold(ctx, lm, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ container, name, want string }{
		{"web", "step1", "111111111111"},
		{"db", "step1", "222222222222"},
		{"db", "only", ""},
		{"web", "0123456789ab", ""},
	} {
		got, err := Named(ctx, lm, "ns", tc.container, tc.name)
		if err != nil {
			t.Fatal(err)
		}
		ids := ""
		for _, r := range got {
			ids += r.ID
		}
		if ids != tc.want {
			t.Errorf("Named(%s, %s) = %q, want %q", tc.container, tc.name, ids, tc.want)
		}
	}
}
