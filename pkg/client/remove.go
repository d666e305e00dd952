package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/pagechain"
)

// RemoveOptions shape Remove.
type RemoveOptions struct {
	// Recursive removes the checkpoint and every checkpoint below it in the tree. Without it the
	// checkpoint alone goes: its children then hang under its parent (Tree), and its frozen
	// layer stays as long as theirs are stacked on it.
	Recursive bool
	// Force removes a subtree even when it holds a running container's current checkpoint (the
	// one its rootfs is stacked on): that container runs on, but no checkpoint names its state
	// any more.
	Force bool
	// GC collects garbage before returning, so that the layers nothing else uses are freed now.
	GC bool
	// ImageDir also removes each checkpoint's image directory, if its cklite.json still names
	// the checkpoint.
	ImageDir bool
}

// Remove removes the checkpoint ref names (with Recursive, its subtree, children first) and
// returns what it removed: their leases go, and containerd's collector frees the layers nothing
// else uses. A subtree holding the current checkpoint of a running container is refused
// (errdefs.ErrFailedPrecondition) unless Force. On an error the checkpoints returned are gone and
// the others are still there, each with its ancestors.
func (c *Client) Remove(ctx context.Context, ref string, opts RemoveOptions) ([]checkpoint.Record, error) {
	ctx = c.Context(ctx)
	tree, err := c.removalTree(ctx, opts.Recursive)
	if err != nil {
		return nil, err
	}
	n, err := tree.Lookup(ref)
	if err != nil {
		return nil, err
	}
	nodes := []*checkpoint.Node{n}
	if opts.Recursive {
		nodes = n.Subtree()
		if err := tree.inUse(nodes); err != nil && !opts.Force {
			return nil, err
		}
	}
	var del []leases.DeleteOpt
	if opts.GC {
		del = append(del, leases.SynchronousDelete)
	}
	var removed []checkpoint.Record
	for _, n := range nodes {
		if err := c.ctrd.LeasesService().Delete(ctx, leases.Lease{ID: checkpoint.LeaseID(n.ID)}, del...); err != nil && !errdefs.IsNotFound(err) {
			return removed, fmt.Errorf("checkpoint %s: delete lease: %w", n.ID, err)
		}
		removed = append(removed, n.Record)
		if opts.ImageDir {
			if err := removeImageDir(n.Record); err != nil {
				return removed, fmt.Errorf("checkpoint %s removed, but not its image directory: %w", n.ID, err)
			}
		}
	}
	return removed, nil
}

// removalTree is the tree a removal looks its checkpoint up in. A subtree is the one Tree draws
// (across removed checkpoints, with the containers that run on each); one checkpoint needs only
// the records, which spares a caller removing hundreds one by one the containers' and layers'
// lookups.
func (c *Client) removalTree(ctx context.Context, recursive bool) (*Tree, error) {
	if recursive {
		return c.Tree(ctx, Filter{})
	}
	records, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	return &Tree{Tree: checkpoint.NewTree(records)}, nil
}

// inUse refuses nodes when one is the current checkpoint of a running container.
func (t *Tree) inUse(nodes []*checkpoint.Node) error {
	var uses []string
	for _, n := range nodes {
		for _, id := range n.Current {
			if ctr := t.Containers[id]; ctr.Running {
				uses = append(uses, fmt.Sprintf("%s runs on %s", describe(ctr), n.ID))
			}
		}
	}
	if len(uses) == 0 {
		return nil
	}
	return fmt.Errorf("the subtree holds the state of running containers (%s): stop them, or remove it anyway with --force: %w",
		strings.Join(uses, ", "), errdefs.ErrFailedPrecondition)
}

// describe is ctr's name, or its id.
func describe(ctr Container) string {
	if ctr.Name != "" {
		return ctr.Name
	}
	return ctr.ID
}

// removeImageDir removes the image directory r recorded, but only while its metadata file still
// names r: the directory may have been reused for another checkpoint, or may never have been
// cklite's. A directory already gone is fine. The image directories that read pages from it
// (pkg/pagechain) stay restorable: those pages are copied into them first.
func removeImageDir(r checkpoint.Record) error {
	if r.ImagePath == "" {
		return nil
	}
	if _, err := os.Stat(r.ImagePath); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	m, err := checkpoint.Read(r.ImagePath)
	if err != nil {
		return fmt.Errorf("left %s: %w", r.ImagePath, err)
	}
	if m.ID != r.ID {
		return fmt.Errorf("left %s: it now holds checkpoint %s: %w", r.ImagePath, m.ID, errdefs.ErrFailedPrecondition)
	}
	_, err = pagechain.Remove(r.ImagePath)
	return err
}
