package checkpoint

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
)

// Keys of the container labels a client sets for the one checkpoint it is about to take (the
// task API's checkpoint options have no field for them): the checkpoint's name, and its labels
// as a JSON object.
const (
	NameKey   = "cklite.io/checkpoint-name"
	LabelsKey = "cklite.io/checkpoint-labels"
)

// Lease labels of a checkpoint's name and of each of its labels (LabelUserPrefix + key).
const (
	LabelName       = "cklite.io/checkpoint.name"
	LabelUserPrefix = "cklite.io/checkpoint.label."
)

// nameRE is what a checkpoint name may be: nerdctl's container name syntax. A name of 12 hex
// digits would read as another checkpoint's id.
var (
	nameRE  = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
	idLikeR = regexp.MustCompile(`^[0-9a-f]{12}$`)
)

// ValidateName refuses a name that is not [a-zA-Z0-9][a-zA-Z0-9_.-]* or reads as a checkpoint id.
func ValidateName(name string) error {
	switch {
	case !nameRE.MatchString(name) || len(name) > 128:
		return fmt.Errorf("checkpoint name %q: want [a-zA-Z0-9][a-zA-Z0-9_.-]*, at most 128 characters: %w", name, errdefs.ErrInvalidArgument)
	case idLikeR.MatchString(name):
		return fmt.Errorf("checkpoint name %q reads as a checkpoint id: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ParseLabel splits "k=v"; the key must not be empty.
func ParseLabel(kv string) (string, string, error) {
	k, v, ok := strings.Cut(kv, "=")
	if !ok || k == "" {
		return "", "", fmt.Errorf("label %q: want KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)
	}
	return k, v, nil
}

// RequestedName is the name asked for the container's next checkpoint ("" for none).
func RequestedName(labels map[string]string) (string, error) {
	name := labels[NameKey]
	if name == "" {
		return "", nil
	}
	return name, ValidateName(name)
}

// RequestedLabels are the labels asked for the container's next checkpoint.
func RequestedLabels(labels map[string]string) (map[string]string, error) {
	v := labels[LabelsKey]
	if v == "" {
		return nil, nil
	}
	var out map[string]string
	if err := json.Unmarshal([]byte(v), &out); err != nil {
		return nil, fmt.Errorf("%s=%q: want a JSON object of strings: %v: %w", LabelsKey, v, err, errdefs.ErrInvalidArgument)
	}
	return out, nil
}

// EncodeLabels is the value of LabelsKey for labels.
func EncodeLabels(labels map[string]string) string {
	b, _ := json.Marshal(labels) // a map of strings always marshals
	return string(b)
}

// HasLabels reports whether m carries every label of want.
func (m Meta) HasLabels(want map[string]string) bool {
	for k, v := range want {
		if got, ok := m.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// userLabels reads a checkpoint's own labels from its lease's labels.
func userLabels(lease map[string]string) map[string]string {
	var out map[string]string
	for k, v := range lease {
		if key, ok := strings.CutPrefix(k, LabelUserPrefix); ok {
			if out == nil {
				out = map[string]string{}
			}
			out[key] = v
		}
	}
	return out
}

// Lookup finds the checkpoint ref names, as docker resolves a container: the checkpoint whose id
// is ref; else the one named ref (names are unique per container, so several containers'
// checkpoints may share one); else the only one whose id starts with ref; else, for "k=v", the
// only one with that label. No match is errdefs.ErrNotFound; several are
// errdefs.ErrInvalidArgument listing them.
func (t *Tree) Lookup(ref string) (*Node, error) {
	if ref == "" {
		return nil, fmt.Errorf("empty checkpoint id: %w", errdefs.ErrInvalidArgument)
	}
	if n, ok := t.byID[ref]; ok {
		return n, nil
	}
	steps := []struct {
		what  string
		match func(*Node) bool
	}{
		{"name", func(n *Node) bool { return n.Name == ref }},
		{"id prefix", func(n *Node) bool { return strings.HasPrefix(n.ID, ref) }},
	}
	if k, v, err := ParseLabel(ref); err == nil {
		steps = append(steps, struct {
			what  string
			match func(*Node) bool
		}{"label", func(n *Node) bool { return n.HasLabels(map[string]string{k: v}) }})
	}
	for _, s := range steps {
		var matches []*Node
		for _, id := range slices.Sorted(maps.Keys(t.byID)) {
			if n := t.byID[id]; s.match(n) {
				matches = append(matches, n)
			}
		}
		switch len(matches) {
		case 0:
			continue
		case 1:
			return matches[0], nil
		}
		var names []string
		for _, n := range matches {
			names = append(names, n.Describe())
		}
		return nil, fmt.Errorf("checkpoint %s %q is ambiguous: it matches %s (name one by its id): %w", s.what, ref, strings.Join(names, ", "), errdefs.ErrInvalidArgument)
	}
	return nil, fmt.Errorf("no checkpoint %q: %w", ref, errdefs.ErrNotFound)
}

// Describe names n for a person: its id, with its name and container when it has them.
func (n *Node) Describe() string {
	var extra []string
	if n.Name != "" {
		extra = append(extra, "name "+n.Name)
	}
	if n.Container != "" {
		extra = append(extra, "container "+n.Container)
	}
	if len(extra) == 0 {
		return n.ID
	}
	return n.ID + " (" + strings.Join(extra, ", ") + ")"
}
