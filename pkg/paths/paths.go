// Package paths says where cklite keeps its files on a host. Every default is computed here, from
// the configuration and the containerd instance a program works for, so that the shim, the CLI
// and `cklite setup` agree on them; docs/configuration.md lists them all.
//
// A host may run several containerds at once (the system's, private ones, test harnesses), and
// their namespace names repeat ("default", "k8s.io"). State that belongs to what one containerd
// holds is therefore kept in a directory of that containerd alone, below the state directory
// (shim.toml's state_dir):
//
//	STATE_DIR/containerd/UUID/checkpoints/NAMESPACE/CONTAINER-TIME  `cklite checkpoint create`'s image directories
//	STATE_DIR/containerd/UUID/checkpoints/k8s.io/pod-ID             a pod checkpoint (pkg/podckpt); pod-forks/UID: a fork's volumes
//	STATE_DIR/containerd/UUID/images/DIGEST                         CRIU images extracted from checkpoint images
//
// UUID is containerd's own identity, what its introspection service's Server call returns: a
// file in containerd's root directory, so it stays the same across restarts and whatever socket
// containerd listens on, and differs for every root. Both the shim (given containerd's address)
// and the CLI can ask for it. An address would not do: one containerd answers to several
// spellings of it (a symlink, a relative path, unix://), and one socket path may serve different
// roots over time, whose checkpoints must not meet.
//
// What concerns the host itself stays host-wide: CRIU's kerndat cache (facts about the kernel,
// DefaultRunDir/criu, set when CRIU is built) and the snapshotter's defaults, which serve the
// host's containerd at /run/containerd/containerd.sock (a second containerd gets a snapshotter of
// its own, configured by `cklite setup`).
package paths

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/introspection"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/google/uuid"
)

// Host-wide defaults: configuration, state and runtime files.
const (
	DefaultConfigDir = "/etc/cklite"
	DefaultStateDir  = "/var/lib/cklite"
	DefaultRunDir    = "/run/cklite"
)

// Instance is the directory of one containerd instance's cklite state.
type Instance struct {
	// UUID is containerd's (introspection Server).
	UUID string
	// Dir is STATE_DIR/containerd/UUID.
	Dir string
}

// NewInstance is the instance directory of the containerd whose UUID is id, below stateDir. id
// becomes a path element: anything but a UUID is refused.
func NewInstance(stateDir, id string) (Instance, error) {
	u, err := uuid.Parse(id)
	if err != nil || u.String() != id {
		return Instance{}, fmt.Errorf("containerd's UUID %q is not one: %w", id, err)
	}
	if !filepath.IsAbs(stateDir) {
		return Instance{}, fmt.Errorf("state directory %q: want an absolute path", stateDir)
	}
	return Instance{UUID: id, Dir: filepath.Join(stateDir, "containerd", id)}, nil
}

// ForContainerd asks containerd (its introspection service) for its UUID and returns its instance
// directory below stateDir.
func ForContainerd(ctx context.Context, stateDir string, svc introspection.Service) (Instance, error) {
	resp, err := svc.Server(ctx)
	if err != nil {
		return Instance{}, fmt.Errorf("ask containerd for its UUID (introspection): %w", err)
	}
	return NewInstance(stateDir, resp.GetUUID())
}

// Checkpoints holds the image directories of the checkpoints taken without one named, one
// directory per namespace: Checkpoints()/NAMESPACE/CONTAINER-TIME.
func (i Instance) Checkpoints() string { return filepath.Join(i.Dir, "checkpoints") }

// NamespaceCheckpoints is Checkpoints()/namespace, namespace checked as containerd checks one (it
// becomes a path element).
func (i Instance) NamespaceCheckpoints(namespace string) (string, error) {
	if err := identifiers.Validate(namespace); err != nil {
		return "", fmt.Errorf("namespace: %w", err)
	}
	return filepath.Join(i.Checkpoints(), namespace), nil
}

// ImageCache holds the CRIU image directories the shim extracts from checkpoint images, one per
// blob digest, shared by every container of this containerd restored from the same image.
func (i Instance) ImageCache() string { return filepath.Join(i.Dir, "images") }
