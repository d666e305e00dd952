package fork

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// Source is the checkpoint to fork and the CRIU image directory every fork is restored from.
type Source struct {
	Checkpoint checkpoint.Meta // as the image directory's metadata file says
	ImageDir   string          // absolute: the shim opens it from its own working directory
}

// SourceOf is checkpoint r with its images in dir, or, when dir is "", in the directory r
// recorded. The directory's metadata must be r's.
func SourceOf(r checkpoint.Record, dir string) (Source, error) {
	if dir == "" {
		dir = r.ImagePath
	}
	if dir == "" {
		return Source{}, fmt.Errorf("checkpoint %s has no image directory: its CRIU images went to a temporary "+
			"directory that lived only during the checkpoint (a ctr checkpoint image, which keeps them in the "+
			"content store). Checkpoint into a directory that stays, with `ctr tasks checkpoint --image-path DIR` "+
			"or `nerdctl checkpoint create`, or give the directory that holds its images: %w", r.ID, errdefs.ErrFailedPrecondition)
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return Source{}, fmt.Errorf("image directory %s of checkpoint %s no longer exists: %w", dir, r.ID, errdefs.ErrNotFound)
	}
	src, err := FromImageDir(dir)
	if err != nil {
		return Source{}, err
	}
	if src.Checkpoint.ID != r.ID {
		return Source{}, fmt.Errorf("image directory %s holds checkpoint %s, not %s: %w", dir, src.Checkpoint.ID, r.ID, errdefs.ErrInvalidArgument)
	}
	return src, nil
}

// FromImageDir is the checkpoint whose images are in dir, as its metadata file describes it.
func FromImageDir(dir string) (Source, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Source{}, fmt.Errorf("image directory %s: %w", dir, err)
	}
	m, err := checkpoint.Read(abs)
	if err != nil {
		return Source{}, err
	}
	return Source{Checkpoint: m, ImageDir: abs}, nil
}
