package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
)

// nerdctlNameLabel is the label in which nerdctl keeps a container's name.
const nerdctlNameLabel = "nerdctl/name"

// resolveContainer finds the container of the namespace in ctx that ref names, as docker and
// nerdctl do: the container whose id is ref; else the one named ref (nerdctl's name label); else
// the only one whose id starts with ref. Several matches are errdefs.ErrInvalidArgument listing
// them; none is errdefs.ErrNotFound.
func resolveContainer(ctx context.Context, ctrd *client.Client, ref string) (client.Container, error) {
	namespace, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	if ref == "" {
		return nil, fmt.Errorf("empty container name: %w", errdefs.ErrInvalidArgument)
	}
	all, err := ctrd.ContainerService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	id, err := pickContainer(all, namespace, ref)
	if err != nil {
		return nil, err
	}
	return ctrd.LoadContainer(ctx, id)
}

// pickContainer is resolveContainer's choice among all.
func pickContainer(all []containers.Container, namespace, ref string) (string, error) {
	for _, c := range all {
		if c.ID == ref {
			return c.ID, nil
		}
	}
	for _, step := range []struct {
		what  string
		match func(containers.Container) bool
	}{
		{"name", func(c containers.Container) bool { return c.Labels[nerdctlNameLabel] == ref }},
		{"id prefix", func(c containers.Container) bool { return strings.HasPrefix(c.ID, ref) }},
	} {
		var matches []string
		for _, c := range all {
			if step.match(c) {
				matches = append(matches, describeContainer(c))
			}
		}
		switch len(matches) {
		case 0:
			continue
		case 1:
			return strings.Fields(matches[0])[0], nil
		}
		slices.Sort(matches)
		return "", fmt.Errorf("container %s %q is ambiguous in namespace %s: it matches %s: %w",
			step.what, ref, namespace, strings.Join(matches, ", "), errdefs.ErrInvalidArgument)
	}
	return "", fmt.Errorf("no container %q in namespace %s (by id, name or id prefix): %w", ref, namespace, errdefs.ErrNotFound)
}

// describeContainer is c's id, and its name when nerdctl gave it one.
func describeContainer(c containers.Container) string {
	if name := c.Labels[nerdctlNameLabel]; name != "" {
		return c.ID + " (" + name + ")"
	}
	return c.ID
}
