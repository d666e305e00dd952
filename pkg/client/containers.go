package client

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// NerdctlNameLabel is the label in which nerdctl keeps a container's name.
const NerdctlNameLabel = "nerdctl/name"

// generatedID is what nerdctl and the CRI plugin name a container: 64 hex digits.
var generatedID = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Container finds the container of the client's namespace that ref names, as docker and nerdctl
// do: the container whose id is ref; else the one named ref (nerdctl's name label); else the
// only one whose id starts with ref. Several matches are errdefs.ErrInvalidArgument listing them;
// none is errdefs.ErrNotFound.
func (c *Client) Container(ctx context.Context, ref string) (containerd.Container, error) {
	ctx = c.Context(ctx)
	if ref == "" {
		return nil, fmt.Errorf("empty container name: %w", errdefs.ErrInvalidArgument)
	}
	// A whole generated id (nerdctl's, the CRI's), what programs pass, needs one Get, not the
	// list of every container; a name or prefix is not asked for by Get first, which would cost
	// it a round trip.
	if generatedID.MatchString(ref) {
		if ctr, err := c.ctrd.LoadContainer(ctx, ref); err == nil {
			return ctr, nil
		}
	}
	all, err := c.ctrd.ContainerService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	id, err := pickContainer(all, c.namespace, ref)
	if err != nil {
		return nil, err
	}
	return c.ctrd.LoadContainer(ctx, id)
}

// ContainerName is the nerdctl name of container, or "": the record loaded with it, not one
// more round trip (a name is set when nerdctl creates the container).
func ContainerName(ctx context.Context, container containerd.Container) string {
	info, err := container.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return ""
	}
	return info.Labels[NerdctlNameLabel]
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
		{"name", func(c containers.Container) bool { return c.Labels[NerdctlNameLabel] == ref }},
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
	if name := c.Labels[NerdctlNameLabel]; name != "" {
		return c.ID + " (" + name + ")"
	}
	return c.ID
}

// CkliteContainer is the container ref names, refused, before anything is asked of its task,
// unless it runs on cklite's runtime (errdefs.ErrNotImplemented).
func (c *Client) CkliteContainer(ctx context.Context, ref string) (containerd.Container, error) {
	ctx = c.Context(ctx)
	ctr, err := c.Container(ctx, ref)
	if err != nil {
		return nil, err
	}
	id := ctr.ID()
	info, err := ctr.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", id, err)
	}
	if err := checkpoint.CheckRuntime(id, info.Runtime.Name); err != nil {
		// Under the runc name by path (docs/architecture.md) the record does not say which shim
		// runs the task: the task's init, whose parent is its shim, does.
		if shim := shimBinary(ctx, ctr); shim != "" && checkpoint.CheckRuntime(id, shim) == nil {
			return ctr, nil
		}
		return nil, err
	}
	return ctr, nil
}

// shimBinary is the path of the binary of the shim running c's task, or "" when that cannot be
// told: no task, or its init not in this PID namespace. A shim is the parent of its task's init
// (a child subreaper, also of a restored one).
func shimBinary(ctx context.Context, c containerd.Container) string {
	task, err := c.Task(ctx, nil)
	if err != nil || task.Pid() == 0 {
		return ""
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", task.Pid()))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(status), "\n") {
		if ppid, ok := strings.CutPrefix(line, "PPid:"); ok {
			exe, err := os.Readlink(fmt.Sprintf("/proc/%s/exe", strings.TrimSpace(ppid)))
			if err != nil {
				return ""
			}
			return strings.TrimSuffix(exe, " (deleted)")
		}
	}
	return ""
}
