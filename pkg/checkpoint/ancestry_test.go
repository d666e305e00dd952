package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

// layers is a snapshotter's chain: name -> parent, and name -> the checkpoint its label names.
type layers struct {
	parent map[string]string
	id     map[string]string
	broken string // Stat of this one fails
}

func (l layers) stat(_ context.Context, _, name string) (snapshots.Info, error) {
	if name == l.broken {
		return snapshots.Info{}, errors.New("snapshotter down")
	}
	p, ok := l.parent[name]
	if !ok {
		return snapshots.Info{}, fmt.Errorf("%s: %w", name, errdefs.ErrNotFound)
	}
	return snapshots.Info{Name: name, Parent: p, Labels: map[string]string{LabelID: l.id[name]}}, nil
}

func TestKeepAncestry(t *testing.T) {
	// image <- A <- B <- C, and B <- D; B was removed (its layer stays: C's and D's are on it).
	chain := layers{
		parent: map[string]string{"image": "", "fa": "image", "fb": "fa", "fc": "fb", "fd": "fb", "fx": "image"},
		id:     map[string]string{"fa": "a", "fb": "b", "fc": "c", "fd": "d", "fx": "x"},
	}
	frozen := func(id, parent string, minute int) Record {
		r := rec(id, parent, minute)
		r.Frozen, r.Snapshotter = "f"+id, "cklite"
		return r
	}
	for _, tc := range []struct {
		name    string
		records []Record
		layers  layers
		want    string
		says    string
	}{
		{"middle removed: children under its parent", []Record{frozen("a", "", 0), frozen("c", "b", 2), frozen("d", "b", 3)}, chain,
			"a\n├─ c\n└─ d\n", ""},
		{"two generations removed", []Record{frozen("c", "b", 2)}, chain, "c ?\n", ""},
		{"root removed: an orphan", []Record{frozen("b", "a", 1), frozen("c", "b", 2)}, chain, "b ?\n└─ c\n", ""},
		{"memory-only: no layers to walk", []Record{frozen("a", "", 0), rec("m", "gone", 4)}, chain, "a\nm ?\n", ""},
		{"own layer gone", []Record{frozen("a", "", 0), frozen("z", "b", 5)}, chain, "a\nz ?\n", ""},
		{"snapshotter fails", []Record{frozen("a", "", 0), frozen("c", "b", 2)}, layers{parent: chain.parent, id: chain.id, broken: "fb"},
			"", "ancestry of checkpoint c: snapshotter down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			records := slices.Clone(tc.records)
			err := KeepAncestry(context.Background(), records, tc.layers.stat)
			if tc.says != "" {
				if err == nil || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("KeepAncestry = %v, want an error saying %q", err, tc.says)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := render(NewTree(records)); got != tc.want {
				t.Fatalf("tree:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestSetCurrentAndSubtree(t *testing.T) {
	tree := NewTree([]Record{rec("a", "", 0), rec("b", "a", 1), rec("c", "b", 2), rec("d", "a", 3)})
	tree.SetCurrent(map[string]Lineage{
		"web": {"c", "b", "a"}, "fork-2": {"d", "a"}, "fork-1": {"d", "a"}, "fresh": nil, "elsewhere": {"gone", "a"},
	})
	var current []string
	for _, l := range tree.Lines() {
		current = append(current, l.ID+"="+strings.Join(l.Current, ","))
	}
	if got, want := strings.Join(current, " "), "a= b= c=web d=fork-1,fork-2"; got != want {
		t.Fatalf("current nodes %s, want %s (a container whose checkpoint is gone marks none)", got, want)
	}
	a, err := tree.Lookup("a")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, n := range a.Subtree() {
		ids = append(ids, n.ID)
	}
	if got, want := strings.Join(ids, " "), "c b d a"; got != want {
		t.Fatalf("subtree of a: %s, want %s (children before parents)", got, want)
	}
}
