package client

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/pelletier/go-toml/v2"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// Where nerdctl's configuration and data are unless configured otherwise.
const (
	defaultNerdctlTOML     = "/etc/nerdctl/nerdctl.toml"
	defaultNerdctlDataRoot = "/var/lib/nerdctl"
)

// NerdctlCheckpoints is the directory in which `nerdctl checkpoint create` keeps its
// checkpoints (<data_root>/checkpoints/NAME), for the nerdctl configuration a nerdctl run here
// would read: $NERDCTL_TOML, else /etc/nerdctl/nerdctl.toml, and its data_root (default
// /var/lib/nerdctl). nerdctl's --data-root flag is not known here.
func NerdctlCheckpoints() (string, error) {
	path := os.Getenv("NERDCTL_TOML")
	if path == "" {
		path = defaultNerdctlTOML
	}
	var cfg struct {
		DataRoot string `toml:"data_root"`
	}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return "", fmt.Errorf("nerdctl configuration: %w", err)
	default:
		if err := toml.Unmarshal(data, &cfg); err != nil {
			return "", fmt.Errorf("nerdctl configuration %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
		}
	}
	if cfg.DataRoot == "" {
		cfg.DataRoot = defaultNerdctlDataRoot
	}
	return filepath.Join(cfg.DataRoot, "checkpoints"), nil
}

// nerdctlImages finds a checkpoint's images among nerdctl's checkpoints: the directory of the
// nerdctl checkpoint named name, or else the one whose cklite.json is checkpoint id's. nerdctl
// records none of it: it checkpoints through the daemon's temporary directory (which the shim
// records no path of) and extracts the images it tarred into its own. "" when none is.
func nerdctlImages(id, name string) string {
	root, err := NerdctlCheckpoints()
	if err != nil {
		return ""
	}
	if name != "" && filepath.Base(name) == name {
		if _, err := checkpoint.Read(filepath.Join(root, name)); err == nil {
			return filepath.Join(root, name)
		}
	}
	if id == "" {
		return ""
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return ""
	}
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		if m, err := checkpoint.Read(dir); err == nil && m.ID == id {
			return dir
		}
	}
	return ""
}
