package client

import (
	"context"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// Checkpoint is a checkpoint as Inspect describes it, and as the CLI prints it with --format
// json: its whole metadata, where its image directory is, the disk its memory takes there, and
// the disk usage of its frozen layer.
type Checkpoint struct {
	checkpoint.Meta
	ImagePath string `json:"imagePath,omitempty"`
	// MemoryStoredBytes is the size of the image directory's own files now: MemoryBytes (the
	// dump as CRIU wrote it) less the pages the shim has since found in the parent checkpoint's
	// images (pkg/pagechain). Unset when the directory is gone or holds another checkpoint.
	MemoryStoredBytes *int64   `json:"memoryStoredBytes,omitempty"`
	Filesystem        *FSUsage `json:"filesystem,omitempty"`
}

// FSUsage is the disk usage of a frozen layer: its own files, not its parents'.
type FSUsage struct {
	Bytes  int64 `json:"bytes"`
	Inodes int64 `json:"inodes"`
}

// Inspect describes the checkpoint ref names (id, name, unique id prefix or KEY=VALUE).
func (c *Client) Inspect(ctx context.Context, ref string) (Checkpoint, error) {
	r, err := c.Lookup(ctx, ref)
	if err != nil {
		return Checkpoint{}, err
	}
	return c.Describe(ctx, r, true)
}

// Describe is the record r with the whole metadata its image directory holds (the lease's
// labels leave out how CRIU dumped it) and, with usage, its frozen layer's usage, which the
// cklite snapshotter computes once per layer. The parent stays r's (the nearest checkpoint still
// listed, see Tree). A failure to read the usage is returned with the rest described.
func (c *Client) Describe(ctx context.Context, r checkpoint.Record, usage bool) (Checkpoint, error) {
	v := Checkpoint{Meta: r.Meta, ImagePath: r.ImagePath}
	if r.ImagePath != "" {
		if m, err := checkpoint.Read(r.ImagePath); err == nil && m.ID == r.ID {
			v.Meta, v.Meta.Parent = m, r.Parent
			if n, err := MemoryStored(r.ImagePath); err == nil && m.Contents.HasMemory() {
				v.MemoryStoredBytes = &n
			}
		}
	}
	if !usage || !r.Contents.HasFS() || r.Frozen == "" {
		return v, nil
	}
	u, err := c.ctrd.SnapshotService(r.Snapshotter).Usage(c.Context(ctx), r.Frozen)
	if err != nil {
		return v, err
	}
	v.Filesystem = &FSUsage{Bytes: u.Size, Inodes: u.Inodes}
	return v, nil
}
