package shim

import (
	"context"
	"slices"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// TestRestoredLineage: a container restored from a checkpoint directory its client named descends
// from that checkpoint and its lineage; one restored from a checkpoint image descends from
// nothing, whatever the image's cklite.json says, so it cannot roll back in place to the other
// containers' checkpoints a crafted lineage names.
func TestRestoredLineage(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fromImage bool
		want      checkpoint.Lineage
	}{
		{"checkpoint directory", false, checkpoint.Lineage{"k1", "victim1", "victim2"}},
		{"checkpoint image", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			meta := checkpoint.Meta{ID: "k1", Container: "elsewhere", Contents: checkpoint.MemoryOnly, Lineage: "victim1 victim2"}
			if err := checkpoint.Write(dir, meta); err != nil {
				t.Fatal(err)
			}
			d := &fakeDaemon{}
			s := &service{daemon: d, admit: func(string, *specs.Spec, string) error { return nil }}
			c := &container{id: "restored", spec: &specs.Spec{}, checkpoint: dir, fromImage: tc.fromImage}
			if _, err := s.prepareRestore(context.Background(), "ns", c, nil); err != nil {
				t.Fatal(err)
			}
			got, ok := d.lineages[c.id]
			if !ok || !slices.Equal(got, tc.want) {
				t.Fatalf("lineage recorded %q (recorded: %v), want %q", got, ok, tc.want)
			}
			victim := checkpoint.Meta{ID: "victim1", Container: "victim"}
			err := checkpoint.MayRollBack(c.id, got, victim, false)
			if tc.fromImage && !errdefs.IsPermissionDenied(err) {
				t.Fatalf("rollback to another container's checkpoint named by the image: %v, want permission denied", err)
			}
		})
	}
}
