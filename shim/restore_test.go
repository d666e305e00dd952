package shim

import (
	"context"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// TestRestoredLineage: a container restored from a checkpoint directory descends from that
// checkpoint and its lineage only when containerd records that checkpoint with its images in that
// very directory; restored from a copy, from a directory this host never wrote, or from a
// checkpoint image it descends from nothing, whatever cklite.json says, so it cannot roll back in
// place to the other containers' checkpoints a crafted lineage names.
func TestRestoredLineage(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fromImage  bool
		recordedAt string // the image directory of k1's record: "dir" (the one restored from), another, or none
		want       checkpoint.Lineage
	}{
		{"directory this host wrote", false, "dir", checkpoint.Lineage{"k1", "victim1", "victim2"}},
		{"copy of the directory", false, "/elsewhere/k1", nil},
		{"directory of no recorded checkpoint", false, "", nil},
		{"checkpoint image", true, "dir", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			meta := checkpoint.Meta{ID: "k1", Container: "elsewhere", Contents: checkpoint.MemoryOnly, Lineage: "victim1 victim2"}
			if err := checkpoint.Write(dir, meta); err != nil {
				t.Fatal(err)
			}
			ctx := namespaces.WithNamespace(context.Background(), "ns")
			d := &fakeDaemon{}
			if tc.recordedAt != "" {
				at := tc.recordedAt
				if at == "dir" {
					at = dir + "/"
				}
				l, err := checkpoint.Hold(ctx, fakeLeases{}, checkpoint.Record{Meta: meta, ImagePath: at})
				if err != nil {
					t.Fatal(err)
				}
				d.recorded = append(d.recorded, l)
			}
			s := &service{daemon: d, admit: func(string, *specs.Spec, string) error { return nil }}
			c := &container{id: "restored", spec: &specs.Spec{}, checkpoint: dir, fromImage: tc.fromImage}
			if _, err := s.prepareRestore(ctx, "ns", c, nil); err != nil {
				t.Fatal(err)
			}
			got, ok := d.lineages[c.id]
			if !ok || !slices.Equal(got, tc.want) {
				t.Fatalf("lineage recorded %q (recorded: %v), want %q", got, ok, tc.want)
			}
			victim := checkpoint.Meta{ID: "victim1", Container: "victim"}
			err := checkpoint.MayRollBack(c.id, got, victim, false)
			if tc.want == nil && !errdefs.IsPermissionDenied(err) {
				t.Fatalf("rollback to another container's checkpoint named by cklite.json: %v, want permission denied", err)
			}
		})
	}
}
