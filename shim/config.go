package shim

import (
	"context"

	"github.com/containerd/log"

	"github.com/cklite/cklite/pkg/config"
)

// shimConfig is the shim's configuration file, read once when the shim starts: a checkpoint does
// not read it again. A file that cannot be read does not stop the shim (containers that never
// checkpoint do not need it); every call that does need it fails with the reason.
type shimConfig struct {
	cfg config.Shim
	err error
}

func loadShimConfig(ctx context.Context) shimConfig {
	cfg, err := config.LoadShim()
	if err != nil {
		log.G(ctx).WithError(err).Warn("shim configuration")
	}
	return shimConfig{cfg: cfg, err: err}
}

// get is the configuration, or why it could not be read.
func (sc shimConfig) get() (config.Shim, error) {
	return sc.cfg, sc.err
}
