package client

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// List returns the namespace's checkpoints, oldest first, as their leases record them.
func (c *Client) List(ctx context.Context) ([]checkpoint.Record, error) {
	return checkpoint.List(c.Context(ctx), c.ctrd.LeasesService(), c.namespace)
}

// Filter selects checkpoints for Tree; the zero Filter selects all.
type Filter struct {
	// Container selects the checkpoints taken of one container: its id, name or unique id
	// prefix, or for a container that is gone, a unique prefix of the id its checkpoints name.
	Container string
	// Labels selects the checkpoints that carry every one of these labels.
	Labels map[string]string
}

// Tree is the checkpoints of a namespace as `cklite checkpoint ls` draws them.
type Tree struct {
	*checkpoint.Tree
	// Containers are the namespace's containers, by id.
	Containers map[string]Container
}

// Container is what the tree says of a container.
type Container struct {
	ID      string
	Name    string // nerdctl's name, or ""
	Running bool   // its task runs or is paused
	// Lineage is the checkpoints its state descends from, nearest first (checkpoint.LineageKey).
	Lineage checkpoint.Lineage
}

// Tree reads the namespace's checkpoints that f selects, arranged by parent. A checkpoint whose
// parent was removed (or expired) hangs under the nearest checkpoint it still descends from
// (checkpoint.KeepAncestry), and each container's current checkpoint carries it in Current.
// When the snapshotter that would tell the ancestry is down, parents stay as recorded.
func (c *Client) Tree(ctx context.Context, f Filter) (*Tree, error) {
	ctx = c.Context(ctx)
	all, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	stat := func(ctx context.Context, sn, name string) (snapshots.Info, error) {
		return c.ctrd.SnapshotService(sn).Stat(ctx, name)
	}
	if err := checkpoint.KeepAncestry(ctx, all, stat); err != nil {
		log.G(ctx).WithError(err).Debug("ancestry of checkpoints whose parent is gone")
	}
	containers, lineages, err := c.containers(ctx)
	if err != nil {
		return nil, err
	}
	selected, err := f.apply(ctx, c, all)
	if err != nil {
		return nil, err
	}
	tree := checkpoint.NewTree(selected)
	listed := make(map[string]bool, len(all))
	for _, r := range all {
		listed[r.ID] = true
	}
	for _, root := range tree.Roots {
		// A parent the filter left out is not gone.
		root.Orphan = root.Orphan && !listed[root.Parent]
	}
	tree.SetCurrent(lineages)
	return &Tree{Tree: tree, Containers: containers}, nil
}

// containers are the namespace's containers and their lineages (checkpoint.LineageKey).
func (c *Client) containers(ctx context.Context) (map[string]Container, map[string]checkpoint.Lineage, error) {
	list, err := c.ctrd.ContainerService().List(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list containers: %w", err)
	}
	resp, err := c.ctrd.TaskService().List(ctx, &tasks.ListTasksRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("list tasks: %w", errgrpc.ToNative(err))
	}
	running := map[string]bool{}
	for _, t := range resp.Tasks {
		running[t.ID] = t.Status == task.Status_RUNNING || t.Status == task.Status_PAUSED || t.Status == task.Status_PAUSING
	}
	out := make(map[string]Container, len(list))
	lineages := make(map[string]checkpoint.Lineage, len(list))
	for _, ctr := range list {
		l := checkpoint.ParseLineage(ctr.Labels[checkpoint.LineageKey])
		out[ctr.ID] = Container{ID: ctr.ID, Name: ctr.Labels[NerdctlNameLabel], Running: running[ctr.ID], Lineage: l}
		lineages[ctr.ID] = l
	}
	return out, lineages, nil
}

// apply keeps the records f selects.
func (f Filter) apply(ctx context.Context, c *Client, records []checkpoint.Record) ([]checkpoint.Record, error) {
	id := ""
	if f.Container != "" {
		ctr, err := c.Container(ctx, f.Container)
		switch {
		case err == nil:
			id = ctr.ID()
		case errdefs.IsNotFound(err):
			// A container that is gone: its checkpoints still name it.
			if id, err = gonePrefix(records, f.Container); err != nil {
				return nil, err
			}
		default:
			return nil, err
		}
	}
	var out []checkpoint.Record
	for _, r := range records {
		if (id == "" || r.Container == id) && r.HasLabels(f.Labels) {
			out = append(out, r)
		}
	}
	return out, nil
}

// gonePrefix is the one container id among records' that starts with ref.
func gonePrefix(records []checkpoint.Record, ref string) (string, error) {
	ids := map[string]bool{}
	for _, r := range records {
		if strings.HasPrefix(r.Container, ref) {
			ids[r.Container] = true
		}
	}
	switch len(ids) {
	case 0:
		return "", fmt.Errorf("no container %q, and no checkpoint of a container whose id starts with it: %w", ref, errdefs.ErrNotFound)
	case 1:
		for id := range ids {
			return id, nil
		}
	}
	return "", fmt.Errorf("container id prefix %q is ambiguous: checkpoints of %s: %w", ref, strings.Join(slices.Sorted(maps.Keys(ids)), ", "), errdefs.ErrInvalidArgument)
}

// Lookup finds the checkpoint ref names (id, name, unique id prefix or KEY=VALUE) by
// checkpoint.Find: the leases that can match, not the whole tree.
func (c *Client) Lookup(ctx context.Context, ref string) (checkpoint.Record, error) {
	return checkpoint.Find(c.Context(ctx), c.ctrd.LeasesService(), c.namespace, ref)
}
