package checkpoint

import (
	"context"
	"fmt"
	"regexp"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
)

// Find is the checkpoint ref names in the namespace of ctx, by Tree.Lookup's rule (id, then name,
// then unique id prefix, then KEY=VALUE label; the same errors), without reading every
// checkpoint: one List of the leases that can match, filtered in containerd. A rollback or fork
// names one checkpoint; listing all of them, with their containers and tasks as a Tree does,
// cost the CLI time that grew with the namespace's checkpoints (docs/performance.md).
func Find(ctx context.Context, lm leases.Manager, namespace, ref string) (Record, error) {
	if ref == "" {
		return Record{}, fmt.Errorf("empty checkpoint id: %w", errdefs.ErrInvalidArgument)
	}
	candidates, err := list(ctx, lm, namespace, findFilters(ref)...)
	if err != nil {
		return Record{}, err
	}
	n, err := NewTree(candidates).Lookup(ref)
	if err != nil {
		return Record{}, err
	}
	return n.Record, nil
}

// findFilters select the leases of the checkpoints ref may name (containerd ORs them): those
// whose id starts with ref (the whole id included), those named ref and, for "k=v", those with
// that label. Every checkpoint each step of the rule matches is among them, so the rule decides
// on the candidates as it would on all.
func findFilters(ref string) []string {
	fs := []string{
		fmt.Sprintf("labels.%q,id~=%q", LabelID, "^"+regexp.QuoteMeta(LeaseID(ref))),
		fmt.Sprintf("labels.%q,labels.%q==%q", LabelID, LabelName, ref),
	}
	if k, v, err := ParseLabel(ref); err == nil {
		fs = append(fs, fmt.Sprintf("labels.%q,labels.%q==%q", LabelID, LabelUserPrefix+k, v))
	}
	return fs
}

// Recorded is the checkpoint id as this containerd records it in the namespace of ctx (its
// lease), read with one filtered List; errdefs.ErrNotFound when there is none. A cklite.json is
// only a claim: what a restore takes from it must match this record.
func Recorded(ctx context.Context, lm leases.Manager, namespace, id string) (Record, error) {
	rs, err := list(ctx, lm, namespace, fmt.Sprintf("labels.%q,id==%q", LabelID, LeaseID(id)))
	if err != nil {
		return Record{}, err
	}
	if len(rs) == 0 {
		return Record{}, fmt.Errorf("checkpoint %s: %w", id, errdefs.ErrNotFound)
	}
	return rs[0], nil
}

// Named are the checkpoints of container named name (at most one, unless leases were written by
// hand), read with one filtered List: what a new name is checked against.
func Named(ctx context.Context, lm leases.Manager, namespace, container, name string) ([]Record, error) {
	return list(ctx, lm, namespace, fmt.Sprintf("labels.%q,labels.%q==%q,labels.%q==%q", LabelID, LabelContainer, container, LabelName, name))
}
