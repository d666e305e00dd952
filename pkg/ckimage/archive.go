package ckimage

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
)

// Archive is a checkpoint archive as the CRI's CheckpointContainer writes it (the kubelet's
// checkpoint), unpacked into Dir.
type Archive struct {
	Dir string
	// Config is config.dump: which container was checkpointed and from which image.
	Config ArchiveConfig
}

// ArchiveConfig is the part of config.dump (checkpointctl's ContainerConfig) an export needs.
type ArchiveConfig struct {
	ID              string `json:"id"`
	Name            string `json:"name"`
	RootfsImageName string `json:"rootfsImageName,omitempty"`
	RootfsImageRef  string `json:"rootfsImageRef,omitempty"`
}

// CRIUDir is the archive's CRIU image directory.
func (a Archive) CRIUDir() string { return filepath.Join(a.Dir, "checkpoint") }

// OpenArchive unpacks the archive at path into a new directory under tmpRoot (removed by the
// caller) and reads its config.dump.
func OpenArchive(path, tmpRoot string) (Archive, error) {
	f, err := os.Open(path)
	if err != nil {
		return Archive{}, fmt.Errorf("checkpoint archive: %w", err)
	}
	defer f.Close()
	dir, err := os.MkdirTemp(tmpRoot, "cklite-archive-")
	if err != nil {
		return Archive{}, err
	}
	a := Archive{Dir: dir}
	if err := untar(f, dir); err != nil {
		os.RemoveAll(dir)
		return Archive{}, fmt.Errorf("checkpoint archive %s: %w: %w", path, err, errdefs.ErrInvalidArgument)
	}
	data, err := os.ReadFile(filepath.Join(dir, "config.dump"))
	if err == nil {
		err = json.Unmarshal(data, &a.Config)
	}
	if err != nil {
		os.RemoveAll(dir)
		return Archive{}, fmt.Errorf("checkpoint archive %s has no readable config.dump (not a CRI checkpoint?): %w: %w", path, err, errdefs.ErrInvalidArgument)
	}
	return a, nil
}
