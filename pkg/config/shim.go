package config

import (
	"fmt"
	"os"
	"time"
)

// DefaultShimConfig is the configuration file of containerd-shim-cklite-v2; the environment
// variable ShimConfigEnv (inherited from containerd, which starts the shims) names another.
const (
	DefaultShimConfig = "/etc/cklite/shim.toml"
	ShimConfigEnv     = "CKLITE_SHIM_CONFIG"
)

// Shim is the configuration of containerd-shim-cklite-v2.
type Shim struct {
	// CheckpointTTL is how long a checkpoint lives when its container asks for no TTL of its own
	// (cklite.io/checkpoint-ttl), as a Go duration such as "24h"; empty: checkpoints live until
	// removed.
	CheckpointTTL string `toml:"checkpoint_ttl"`
}

// LoadShim reads the shim's configuration from ShimConfigEnv's file or the default one (whose
// absence means the defaults).
func LoadShim() (Shim, error) {
	path := os.Getenv(ShimConfigEnv)
	if path == "" {
		path = DefaultShimConfig
	}
	var c Shim
	if err := decodeFile(path, DefaultShimConfig, &c); err != nil {
		return c, err
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
