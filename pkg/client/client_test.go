package client

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/checkpoint"
)

func TestValidateRef(t *testing.T) {
	for _, tc := range []struct {
		ref  string
		says string // "" for a valid one
	}{
		{ref: "localhost/cklite/agent:step1"},
		{ref: "127.0.0.1:5000/cklite/checkpoint:0123456789ab"},
		{ref: "docker.io/library/app:1"},
		{ref: "app:1", says: "nerdctl would look it up as docker.io/library/app:1"},
		{ref: "reg.example/app", says: "as reg.example/app:latest"},
		{ref: "localhost/a b:1", says: "image reference \"localhost/a b:1\""},
		{ref: "", says: "no image reference"},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			err := ValidateRef(tc.ref)
			switch {
			case tc.says == "" && err != nil:
				t.Fatalf("ValidateRef(%q) = %v", tc.ref, err)
			case tc.says != "" && (err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.says)):
				t.Fatalf("ValidateRef(%q) = %v, want an invalid argument saying %q", tc.ref, err, tc.says)
			}
		})
	}
}

func TestCheckpointRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts CheckpointOptions
		want map[string]string
	}{
		{"defaults ask nothing", CheckpointOptions{Contents: checkpoint.MemoryAndFS}, map[string]string{}},
		{"everything", CheckpointOptions{Contents: checkpoint.FSOnly, TTL: time.Hour, Name: "s1", Labels: map[string]string{"k": "v"}},
			map[string]string{checkpoint.ContentsKey: "fs", checkpoint.TTLKey: "1h0m0s", checkpoint.NameKey: "s1", checkpoint.LabelsKey: `{"k":"v"}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.opts.request(); !maps.Equal(got, tc.want) {
				t.Fatalf("request() = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestOrphaned is the lifetime policy (docs/checkpoints.md): a checkpoint goes with prune
// --orphaned only when its container is gone and no container descends from it.
func TestOrphaned(t *testing.T) {
	rec := func(id, container string) checkpoint.Record {
		return checkpoint.Record{Meta: checkpoint.Meta{ID: id, Container: container}}
	}
	tree := &Tree{
		Tree: checkpoint.NewTree([]checkpoint.Record{rec("a", "gone"), rec("b", "gone"), rec("c", "gone"), rec("d", "live")}),
		Containers: map[string]Container{
			"live": {ID: "live", Lineage: checkpoint.Lineage{"d"}},
			"fork": {ID: "fork", Lineage: checkpoint.Lineage{"b", "a"}}, // forked from b, taken on a
		},
	}
	used := tree.descended()
	var orphans []string
	for _, l := range tree.Lines() {
		if _, ok := tree.orphaned(l.Record, used); ok {
			orphans = append(orphans, l.ID)
		}
	}
	if strings.Join(orphans, " ") != "c" {
		t.Fatalf("orphaned: %v, want c alone (a and b are the fork's lineage, d's container lives)", orphans)
	}
}
