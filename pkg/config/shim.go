package config

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cklite/cklite/pkg/paths"
)

// DefaultShimConfig is the configuration file of containerd-shim-cklite-v2, which the cklite CLI
// reads too; the environment variable ShimConfigEnv (inherited from containerd, which starts the
// shims) names another.
const (
	DefaultShimConfig = paths.DefaultConfigDir + "/shim.toml"
	ShimConfigEnv     = "CKLITE_SHIM_CONFIG"
)

// Shim is the configuration of containerd-shim-cklite-v2.
type Shim struct {
	// CheckpointTTL is how long a checkpoint lives when its container asks for no TTL of its own
	// (cklite.io/checkpoint-ttl), as a Go duration such as "24h"; empty: checkpoints live until
	// removed.
	CheckpointTTL string `toml:"checkpoint_ttl"`
	// StateDir holds cklite's state of each containerd instance, by the instance's UUID (see
	// pkg/paths): the image directories of `cklite checkpoint create` and the CRIU images
	// extracted from checkpoint images. Default paths.DefaultStateDir.
	StateDir string `toml:"state_dir"`
}

// ShimConfigPath is the shim's configuration file: ShimConfigEnv's, else the default one.
func ShimConfigPath() string {
	if path := os.Getenv(ShimConfigEnv); path != "" {
		return path
	}
	return DefaultShimConfig
}

// LoadShim reads the shim's configuration from ShimConfigPath (a missing default file means the
// defaults).
func LoadShim() (Shim, error) {
	path := ShimConfigPath()
	c := Shim{StateDir: paths.DefaultStateDir}
	if err := decodeFile(path, DefaultShimConfig, &c); err != nil {
		return c, err
	}
	if !filepath.IsAbs(c.StateDir) {
		return c, fmt.Errorf("configuration %s: state_dir %q: want an absolute path", path, c.StateDir)
	}
	if _, err := c.DefaultTTL(); err != nil {
		return c, fmt.Errorf("configuration %s: %w", path, err)
	}
	return c, nil
}

// DefaultTTL is CheckpointTTL parsed; 0 means none.
func (c Shim) DefaultTTL() (time.Duration, error) {
	if c.CheckpointTTL == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(c.CheckpointTTL)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("checkpoint_ttl %q: want a positive duration such as 24h", c.CheckpointTTL)
	}
	return d, nil
}
