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
	// RestoreTimeout bounds a CRIU restore (a Go duration); past it CRIU and the half-restored
	// task are killed and the restore fails. Default DefaultRestoreTimeout; "0s": no limit.
	RestoreTimeout string `toml:"restore_timeout"`
	// RestoreLogLimitMiB bounds CRIU's restore.log, in MiB (fractions allowed); past it the
	// restore is ended as past its timeout. Default DefaultRestoreLogLimitMiB; 0: no limit.
	RestoreLogLimitMiB *float64 `toml:"restore_log_limit_mib"`
	// DedupMemory stores each checkpoint's memory as what changed since its parent checkpoint's
	// (pkg/pagechain), after the checkpoint, in the background. Default true.
	DedupMemory *bool `toml:"dedup_memory"`
	// Init runs cklite's init as the PID 1 of every container that does not say otherwise with
	// its annotation cklite.io/init (shim/init.go): it reaps the container's orphans, exec'd
	// processes included, whatever the entrypoint does. Default false.
	Init *bool `toml:"init"`
}

// InitOn is Init with its default.
func (c Shim) InitOn() bool { return c.Init != nil && *c.Init }

// DedupMemoryOn is DedupMemory with its default.
func (c Shim) DedupMemoryOn() bool { return c.DedupMemory == nil || *c.DedupMemory }

// Defaults of the restore limits: a container's restore takes well under a second per GiB of
// memory here, and writes a few hundred KiB of log.
const (
	DefaultRestoreTimeout     = "60s"
	DefaultRestoreLogLimitMiB = 64
)

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
	if _, _, err := c.RestoreLimits(); err != nil {
		return c, fmt.Errorf("configuration %s: %w", path, err)
	}
	return c, nil
}

// RestoreLimits are RestoreTimeout and RestoreLogLimitMiB (in bytes) with their defaults; 0
// means no limit.
func (c Shim) RestoreLimits() (timeout time.Duration, logBytes int64, err error) {
	s := c.RestoreTimeout
	if s == "" {
		s = DefaultRestoreTimeout
	}
	timeout, err = time.ParseDuration(s)
	if err != nil || timeout < 0 {
		return 0, 0, fmt.Errorf("restore_timeout %q: want a duration such as 60s (0s: none)", c.RestoreTimeout)
	}
	mib := float64(DefaultRestoreLogLimitMiB)
	if c.RestoreLogLimitMiB != nil {
		mib = *c.RestoreLogLimitMiB
	}
	if mib < 0 {
		return 0, 0, fmt.Errorf("restore_log_limit_mib %g: want MiB >= 0 (0: none)", mib)
	}
	return timeout, int64(mib * (1 << 20)), nil
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
