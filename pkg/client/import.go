package client

import (
	"context"
	"fmt"
	"io"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/platforms"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/ckimage"
)

// ImportOptions shape Import.
type ImportOptions struct {
	// Snapshotter, if set, is where to unpack the images now (default: when a container is
	// made from one).
	Snapshotter string
}

// Imported is one image Import brought in.
type Imported struct {
	Image          string `json:"image"`
	Digest         string `json:"digest"`
	Checkpoint     string `json:"checkpoint,omitempty"` // "" for an image that holds no checkpoint
	CheckpointName string `json:"checkpointName,omitempty"`
	// NotCheckpoint says why an image of the archive holds no checkpoint (it is imported all the
	// same).
	NotCheckpoint error `json:"-"`
}

// Import imports the images of an OCI archive (what Export's Archive writes) for this host's
// platform, and says which checkpoint each holds.
func (c *Client) Import(ctx context.Context, r io.Reader, opts ImportOptions) ([]Imported, error) {
	ctx = c.Context(ctx)
	imgs, err := c.ctrd.Import(ctx, r, containerd.WithImportPlatform(platforms.DefaultStrict()))
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	res := []Imported{}
	for _, i := range imgs {
		r := Imported{Image: i.Name, Digest: i.Target.Digest.String()}
		if _, err := ckimage.Find(ctx, c.ctrd.ContentStore(), i.Name, i.Target, platforms.Default()); err != nil {
			r.NotCheckpoint = err
		} else if m, err := checkpoint.FromImage(ctx, c.ctrd.ContentStore(), i.Target); err == nil {
			r.Checkpoint, r.CheckpointName = m.ID, m.Name
		}
		res = append(res, r)
		if opts.Snapshotter != "" {
			if err := containerd.NewImage(c.ctrd, i).Unpack(ctx, opts.Snapshotter); err != nil {
				return res, fmt.Errorf("unpack %s into %s: %w", i.Name, opts.Snapshotter, err)
			}
		}
	}
	return res, nil
}
