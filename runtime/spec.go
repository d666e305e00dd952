package runtime

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ConfigOptions are the runc options that shape the libcontainer configuration.
type ConfigOptions struct {
	ID           string
	NoPivotRoot  bool
	NoNewKeyring bool
}

// LoadSpec reads <bundle>/config.json.
func LoadSpec(bundle string) (*specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read OCI spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("invalid OCI spec %s: %w: %w", filepath.Join(bundle, "config.json"), err, errdefs.ErrInvalidArgument)
	}
	return &spec, nil
}

// NewConfig converts an OCI spec into a libcontainer configuration. specconv resolves relative
// paths against the process's working directory (runc's cwd is always the bundle); the shim
// must not depend on its cwd, so the rootfs and bind-mount sources are made absolute first.
func NewConfig(bundle string, spec *specs.Spec, o ConfigOptions) (*configs.Config, error) {
	if spec.Root == nil || spec.Root.Path == "" {
		return nil, fmt.Errorf("OCI spec has no root path: %w", errdefs.ErrInvalidArgument)
	}
	if spec.Process == nil {
		return nil, fmt.Errorf("OCI spec has no process: %w", errdefs.ErrInvalidArgument)
	}
	if spec.Linux == nil {
		return nil, fmt.Errorf("OCI spec has no linux section: %w", errdefs.ErrInvalidArgument)
	}
	spec.Root.Path = absIn(bundle, spec.Root.Path)
	if _, err := os.Stat(spec.Root.Path); err != nil {
		return nil, fmt.Errorf("container rootfs: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	for i := range spec.Mounts {
		m := &spec.Mounts[i]
		if m.Source != "" && isBind(m) {
			m.Source = absIn(bundle, m.Source)
		}
	}
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName:   o.ID,
		NoPivotRoot:  o.NoPivotRoot,
		NoNewKeyring: o.NoNewKeyring,
		Spec:         spec,
	})
	if err != nil {
		return nil, fmt.Errorf("convert OCI spec: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return cfg, nil
}

func absIn(dir, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

func isBind(m *specs.Mount) bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}
