// Package config reads the TOML configuration files of cklite's programs.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/pelletier/go-toml/v2"

	"github.com/cklite/cklite/pkg/paths"
)

// Defaults of cklite-snapshotter: the socket containerd's [proxy_plugins] entry points at, and
// where layers and metadata live. They serve the host's containerd; another containerd on the
// host needs a snapshotter of its own, with its own address and root (what `cklite setup` writes).
const (
	DefaultSnapshotterConfig  = paths.DefaultConfigDir + "/snapshotter.toml"
	DefaultSnapshotterAddress = paths.DefaultRunDir + "/snapshotter.sock"
	DefaultSnapshotterRoot    = paths.DefaultStateDir + "/snapshotter"
	DefaultContainerdAddress  = "/run/containerd/containerd.sock"
)

// Snapshotter is the configuration of cklite-snapshotter. Command-line flags override it.
type Snapshotter struct {
	// Address is the unix socket serving containerd's snapshots and diff gRPC APIs.
	Address string `toml:"address"`
	// Root holds the layers and the metadata database; it must support overlayfs and d_type.
	Root string `toml:"root"`
	// ContainerdAddress is containerd's socket: the diff service writes the diffs it computes
	// into containerd's content store.
	ContainerdAddress string `toml:"containerd_address"`
	// LogLevel is one of containerd's log levels (trace, debug, info, warn, error).
	LogLevel string `toml:"log_level"`
	// Dedup makes identical files of frozen layers share storage.
	Dedup bool `toml:"dedup"`
	// MergeFanOut is how many layers one merged layer of a deep chain covers (0: the default).
	MergeFanOut int `toml:"merge_fan_out"`
	// AsyncRemove leaves removed snapshots' directories to the next cleanup (containerd runs one
	// after each garbage collection), making Remove a metadata change only.
	AsyncRemove bool `toml:"async_remove"`
}

// LoadSnapshotter reads path over the defaults. A missing file at the default path is not an
// error: the defaults apply; any other missing file is.
func LoadSnapshotter(path string) (Snapshotter, error) {
	c := Snapshotter{
		Address:           DefaultSnapshotterAddress,
		Root:              DefaultSnapshotterRoot,
		ContainerdAddress: DefaultContainerdAddress,
		LogLevel:          "info",
	}
	return c, decodeFile(path, DefaultSnapshotterConfig, &c)
}

// decodeFile decodes the TOML file path into v, refusing unknown keys. A missing file at the
// default path is not an error: v keeps its defaults; any other missing file is.
func decodeFile(path, defaultPath string, v any) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && path == defaultPath {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading configuration: %w", err)
	}
	d := toml.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		var details *toml.StrictMissingError
		if errors.As(err, &details) {
			return fmt.Errorf("configuration %s: %s", path, details.String())
		}
		return fmt.Errorf("configuration %s: %w", path, err)
	}
	return nil
}
