package checkpoint

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestMayRollBack(t *testing.T) {
	// b0 of B; A forked from b0; a1 of A; F forked from a1.
	b0 := Meta{ID: "b0", Container: "B"}
	a1 := Meta{ID: "a1", Container: "A", Lineage: Descend("b0", nil).String()}
	lineageA := Descend(a1.ID, ParseLineage(a1.Lineage))
	lineageF := Descend(a1.ID, ParseLineage(a1.Lineage))
	c0 := Meta{ID: "c0", Container: "C"}
	for _, tc := range []struct {
		name      string
		container string
		lineage   Lineage
		k         Meta
		force     bool
		allowed   bool
	}{
		{"own checkpoint, no lineage", "C", nil, c0, false, true},
		{"own checkpoint", "A", lineageA, a1, false, true},
		{"the checkpoint it was forked from", "F", lineageF, a1, false, true},
		{"an ancestor of its origin", "F", lineageF, b0, false, true},
		{"another container's", "A", lineageA, c0, false, false},
		{"another container's, no lineage", "B", nil, a1, false, false},
		{"another container's, forced", "A", lineageA, c0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := MayRollBack(tc.container, tc.lineage, tc.k, tc.force)
			switch {
			case tc.allowed && err != nil:
				t.Fatalf("refused: %v", err)
			case !tc.allowed && err == nil:
				t.Fatal("allowed")
			case !tc.allowed && !errdefs.IsPermissionDenied(err):
				t.Fatalf("refused with %v, want permission denied", err)
			case !tc.allowed && !(strings.Contains(err.Error(), "container "+tc.k.Container) && strings.Contains(err.Error(), "into "+tc.container)):
				t.Fatalf("refusal %q does not name both containers", err)
			}
		})
	}
}

func TestDescend(t *testing.T) {
	if got := Descend("k", ParseLineage("a k b  a")).String(); got != "k a b" {
		t.Fatalf("Descend = %q, want %q", got, "k a b")
	}
	var long Lineage
	for i := range 2 * maxLineage {
		long = append(long, fmt.Sprintf("%012x", i))
	}
	l := Descend("new", long)
	if len(l) != maxLineage || l[0] != "new" || l[1] != long[0] {
		t.Fatalf("Descend of %d ids kept %d, starting %v; want %d, nearest first", len(long), len(l), l[:2], maxLineage)
	}
	if n := len(l.String()); n > 4000 {
		t.Fatalf("a full lineage is %d bytes: too long for a containerd label", n)
	}
}

func TestCheckRuntime(t *testing.T) {
	for _, tc := range []struct {
		runtime string
		ok      bool
	}{
		{"io.containerd.cklite.v2", true},
		{"/opt/cklite/bin/containerd-shim-cklite-v2", true},
		{"io.containerd.runc.v2", false},
		{"/usr/bin/containerd-shim-runc-v2", false},
		{"", false},
	} {
		err := CheckRuntime("c1", tc.runtime)
		if (err == nil) != tc.ok {
			t.Errorf("CheckRuntime(%q) = %v, want ok %v", tc.runtime, err, tc.ok)
		}
		if err != nil && (!errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "container c1 runs on "+tc.runtime+";")) {
			t.Errorf("CheckRuntime(%q) = %v: want not implemented, naming the container and its runtime", tc.runtime, err)
		}
	}
}
