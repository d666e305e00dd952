package shim

import (
	"debug/elf"
	"fmt"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/exechelper"
)

// The init a restore brings back must run on the binary it was dumped with: CRIU restores the
// init's memory (its heap, stacks, the Go runtime's state) and maps its code again from the file
// bind-mounted at exechelper.InitPath, which it checks by size only (a Go binary has no GNU build
// id), so a cklite upgraded between the checkpoint and the restore, with a helper of the same
// size, would run the dumped state on other code. A checkpoint records the Go build id of the
// helper its init runs (checkpoint.Meta.InitBuild), which a restore requires of the helper it
// mounts. The build id is the binary's: the same build on another host has the same.

// goBuildID returns the Go build id of the binary at path, "" when it has none.
func goBuildID(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("cklite's init: %w", err)
	}
	defer f.Close()
	sec := f.Section(".note.go.buildid")
	if sec == nil {
		return "", nil
	}
	data, err := sec.Data()
	if err != nil {
		return "", fmt.Errorf("cklite's init: build id of %s: %w", path, err)
	}
	// One ELF note: name size (4), description size, type, the name "Go\0\0", the description.
	if len(data) < 16 || f.ByteOrder.Uint32(data) != 4 {
		return "", nil
	}
	n := uint64(f.ByteOrder.Uint32(data[4:]))
	if uint64(len(data)) < 16+n {
		return "", nil
	}
	return string(data[16 : 16+n]), nil
}

// sameInitBuild refuses to restore the checkpoint of meta, dumped with the init, with a helper
// of build id build.
func sameInitBuild(meta checkpoint.Meta, build string) error {
	if !meta.Init || meta.InitBuild == "" || meta.InitBuild == build {
		return nil // not dumped with the init, or by a cklite that did not record its build
	}
	return fmt.Errorf("checkpoint %s was dumped with cklite's init built as %s, and this host's %s is %s: CRIU would restore the init's memory on other code (cklite upgraded since?): restore it with the cklite that took it: %w",
		meta.ID, meta.InitBuild, exechelper.Name, build, errdefs.ErrFailedPrecondition)
}

// initSource is the host binary spec bind-mounts as the init, "" when none.
func initSource(spec *specs.Spec) string {
	for _, m := range spec.Mounts {
		if m.Destination == exechelper.InitPath {
			return m.Source
		}
	}
	return ""
}
