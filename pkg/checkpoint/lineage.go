package checkpoint

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
)

// A container's lineage is the checkpoints its state descends from, nearest first: the checkpoint
// it was restored, forked or rolled back from, that checkpoint's lineage, and the checkpoints the
// container took since. A rollback puts a checkpoint's memory and files into a running container;
// on a platform with one sandbox per user, a checkpoint outside the container's lineage is another
// user's data. MayRollBack is the rule; the shim enforces it, whatever client asks.
//
// The shim keeps the lineage in the container's label LineageKey (it outlives tasks and shims) and
// copies it into each checkpoint's Meta.Lineage, so that a restore of that checkpoint in any
// container, on any host, knows where the checkpoint came from. Ids are space separated.
const (
	// LineageKey is the container label holding the container's lineage. The shim sets it.
	LineageKey = "cklite.io/lineage"
	// ForceForeignKey is the annotation of a rollback Update that allows a checkpoint outside
	// the container's lineage (cklite rollback --force-foreign).
	ForceForeignKey = "cklite.io/rollback-force-foreign"
	// maxLineage bounds a lineage (a label value must stay under containerd's 4 KiB): the
	// farthest ancestors are dropped, which can only refuse a rollback, never allow one.
	maxLineage = 256
)

// Lineage is a parsed lineage: checkpoint ids, nearest first.
type Lineage []string

// ParseLineage reads a lineage as LineageKey and Meta.Lineage hold it.
func ParseLineage(s string) Lineage { return strings.Fields(s) }

// String is l as LineageKey and Meta.Lineage hold it.
func (l Lineage) String() string { return strings.Join(l, " ") }

// Descend is the lineage of a container whose state now comes from checkpoint id, whose own
// lineage is from: id first, then from, without repeats, at most maxLineage ids.
func Descend(id string, from Lineage) Lineage {
	out := Lineage{id}
	for _, a := range from {
		if len(out) == maxLineage {
			break
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// MayRollBack says whether container, of lineage l, may be rolled back to checkpoint k: when k
// was taken of container, or k is in its lineage (the checkpoint it was forked or restored from,
// or one of that checkpoint's ancestors). Otherwise the error is errdefs.ErrPermissionDenied,
// naming both containers, unless force.
func MayRollBack(container string, l Lineage, k Meta, force bool) error {
	if force || k.Container == container || slices.Contains(l, k.ID) {
		return nil
	}
	return fmt.Errorf("checkpoint %s was taken of container %s, which is not %s nor in its lineage (the checkpoints %s was forked or restored from): "+
		"refusing to put %s's memory and files into %s; to do it anyway, roll back with --force-foreign (annotation %s=true): %w",
		k.ID, k.Container, container, container, k.Container, container, ForceForeignKey, errdefs.ErrPermissionDenied)
}
