package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/pagechain"
)

// PruneOptions say which checkpoints Prune removes besides those whose recorded image directory
// is gone (or now holds another checkpoint).
type PruneOptions struct {
	// Dirs are directories whose subdirectories are image directories that count as references
	// (default: NerdctlCheckpoints, when it exists).
	Dirs []string
	// Unreferenced also removes the checkpoints with no recorded image directory that no
	// checkpoint image in the namespace and no directory below Dirs holds.
	Unreferenced bool
	// Orphaned also removes the checkpoints whose container is gone and that no container
	// descends from (docs/cli.md, lifetime): a container's checkpoints outlive it, as its history
	// and the state its forks came from, until nothing uses them. And it removes the image
	// directories in this containerd's own checkpoints directory (Paths) whose checkpoint is no
	// longer listed, and, in CRINamespace, the volume copies of pod forks whose pod is gone.
	Orphaned bool
	DryRun   bool // say what would go, remove nothing
	GC       bool // collect garbage before returning, so that freed layers go now
}

// Pruned is one checkpoint Prune removed (or, DryRun, would remove).
type Pruned struct {
	ID        string `json:"id"`
	Name      string `json:"name,omitempty"`
	Container string `json:"container"`
	Reason    string `json:"reason"`
	Removed   bool   `json:"removed"` // false with DryRun
	// ImageDir is set for an image directory removed by Orphaned: its checkpoint was removed
	// before (or just now, when it is listed as well).
	ImageDir string `json:"imageDir,omitempty"`
	// ForkVolumes is set for the volume copies of a pod fork whose pod is gone, removed by
	// Orphaned in CRINamespace; ID is then the pod's uid.
	ForkVolumes string `json:"forkVolumes,omitempty"`
}

// Checkpoint says whether p is a checkpoint, not a directory.
func (p Pruned) Checkpoint() bool { return p.ImageDir == "" && p.ForkVolumes == "" }

// Prune removes the checkpoints opts selects, children before their parents, and returns them
// and how many checkpoints there were.
func (c *Client) Prune(ctx context.Context, opts PruneOptions) ([]Pruned, int, error) {
	ctx = c.Context(ctx)
	dirs := opts.Dirs
	if len(dirs) == 0 {
		if nerdctl, err := NerdctlCheckpoints(); err == nil {
			if _, err := os.Stat(nerdctl); err == nil {
				dirs = []string{nerdctl}
			}
		}
	}
	tree, err := c.Tree(ctx, Filter{})
	if err != nil {
		return nil, 0, err
	}
	held, err := c.heldCheckpoints(ctx, dirs)
	if err != nil {
		return nil, 0, err
	}
	used := tree.descended()
	if err := c.podMembers(ctx, used); err != nil {
		return nil, 0, err
	}
	var del []leases.DeleteOpt
	if opts.GC {
		del = append(del, leases.SynchronousDelete)
	}
	res := []Pruned{}
	lines := tree.Lines()
	for i := range lines {
		r := lines[len(lines)-1-i].Record // children before parents
		why, prune := pruneReason(r, held, opts.Unreferenced)
		if !prune && opts.Orphaned {
			why, prune = tree.orphaned(r, used)
		}
		if !prune {
			continue
		}
		res = append(res, Pruned{ID: r.ID, Name: r.Name, Container: r.Container, Reason: why})
		if opts.DryRun {
			continue
		}
		if err := c.ctrd.LeasesService().Delete(ctx, leases.Lease{ID: checkpoint.LeaseID(r.ID)}, del...); err != nil && !errdefs.IsNotFound(err) {
			return res[:len(res)-1], len(lines), fmt.Errorf("remove checkpoint %s: %w", r.ID, err)
		}
		res[len(res)-1].Removed = true
	}
	if opts.Orphaned {
		dirs, err := c.orphanedDirs(ctx, lines, res, opts.DryRun)
		res = append(res, dirs...)
		if err != nil {
			return res, len(lines), err
		}
	}
	if opts.Orphaned && c.namespace == CRINamespace {
		forks, err := c.goneForks(ctx, opts.DryRun)
		res = append(res, forks...)
		if err != nil {
			return res, len(lines), err
		}
	}
	return res, len(lines), nil
}

// orphanedDirs removes (unless dryRun) the image directories in the namespace's directory of
// this containerd's checkpoints whose cklite.json names a checkpoint not among lines, or one
// pruned. A directory without a readable cklite.json is left: it may be a checkpoint being
// taken (the shim writes the file last), or not cklite's.
func (c *Client) orphanedDirs(ctx context.Context, lines []checkpoint.Line, pruned []Pruned, dryRun bool) ([]Pruned, error) {
	inst, err := c.Paths(ctx)
	if err != nil {
		return nil, err
	}
	root, err := inst.NamespaceCheckpoints(c.namespace)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoints directory: %w", err)
	}
	kept := map[string]bool{}
	for _, l := range lines {
		kept[l.ID] = true
	}
	for _, p := range pruned {
		kept[p.ID] = kept[p.ID] && !p.Removed && !dryRun
	}
	var res []Pruned
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		m, err := checkpoint.Read(dir)
		if err != nil || kept[m.ID] {
			continue
		}
		p := Pruned{ID: m.ID, Name: m.Name, Container: m.Container, Reason: "its checkpoint is no longer listed", ImageDir: dir}
		if !dryRun {
			// Kept checkpoints may read pages from it: they get them first (pkg/pagechain).
			if _, err := pagechain.Remove(dir); err != nil {
				return res, fmt.Errorf("remove %s: %w", dir, err)
			}
			p.Removed = true
		}
		res = append(res, p)
	}
	return res, nil
}

// descended is the checkpoints some container of the namespace descends from: those in the
// lineage of a container that exists.
func (t *Tree) descended() map[string]bool {
	used := map[string]bool{}
	for _, ctr := range t.Containers {
		for _, id := range ctr.Lineage {
			used[id] = true
		}
	}
	return used
}

// podMembers adds to used the members of the pod checkpoints of CRI's namespace: a pod checkpoint
// holds them until `cklite pod rm`, after its pod and containers are gone too (a fork needs them).
func (c *Client) podMembers(ctx context.Context, used map[string]bool) error {
	if c.namespace != CRINamespace {
		return nil
	}
	pods, err := c.PodCheckpoints(ctx)
	if err != nil {
		return err
	}
	for _, p := range pods {
		for _, id := range p.Checkpoints() {
			used[id] = true
		}
	}
	return nil
}

// orphaned says whether r is orphaned: its container is gone and no container descends from it.
func (t *Tree) orphaned(r checkpoint.Record, used map[string]bool) (string, bool) {
	if _, ok := t.Containers[r.Container]; ok || used[r.ID] {
		return "", false
	}
	return fmt.Sprintf("container %s is gone and no container descends from it", shortID(r.Container)), true
}

// pruneReason says why r goes, or that it stays: its recorded image directory no longer holds it,
// or (with unreferenced) nothing is known to hold it.
func pruneReason(r checkpoint.Record, held map[string]string, unreferenced bool) (string, bool) {
	if r.ImagePath != "" {
		m, err := checkpoint.Read(r.ImagePath)
		switch {
		case err == nil && m.ID == r.ID:
			return "", false
		case err == nil:
			return fmt.Sprintf("its image directory %s now holds checkpoint %s", r.ImagePath, m.ID), true
		case errdefs.IsNotFound(err) || os.IsNotExist(err):
			return fmt.Sprintf("its image directory %s is gone", r.ImagePath), true
		default:
			return "", false // unreadable is not gone
		}
	}
	if _, ok := held[r.ID]; ok || !unreferenced {
		return "", false
	}
	return "no image directory or checkpoint image holds it", true
}

// heldCheckpoints maps the ids of the checkpoints that checkpoint images in the namespace and
// image directories below dirs hold to where they are.
func (c *Client) heldCheckpoints(ctx context.Context, dirs []string) (map[string]string, error) {
	held := map[string]string{}
	imgs, err := c.ctrd.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	for _, img := range imgs {
		m, err := checkpoint.FromImage(ctx, c.ctrd.ContentStore(), img.Target)
		if err == nil {
			held[m.ID] = "image " + img.Name
		}
	}
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("--dir: %w", err)
		}
		for _, e := range entries {
			sub := filepath.Join(dir, e.Name())
			if m, err := checkpoint.Read(sub); err == nil {
				held[m.ID] = sub
			}
		}
	}
	return held, nil
}

func shortID(id string) string { return id[:min(12, len(id))] }
