// Package client is cklite as a Go program drives it: checkpoint a running container, roll it
// back in place, fork a checkpoint into new containers, list, inspect, remove and prune
// checkpoints, export one as an OCI image and import it elsewhere. The cklite CLI is built on it,
// so a program gets what the CLI does, with the same rules and the same errors.
//
// A Client wraps a containerd client and one namespace (the pod calls, pod.go, work on CRI's pods
// in k8s.io whatever it is). Containers and checkpoints are named as on the command line: a
// container by id, nerdctl name or unique id prefix (ResolveContainer), a checkpoint by id,
// name, unique id prefix or KEY=VALUE label (checkpoint.Tree.Lookup). Every
// call takes a context; errors wrap containerd's errdefs (errdefs.IsNotFound for an unknown
// name, IsInvalidArgument for an ambiguous one, IsNotImplemented for a container of another
// runtime, IsFailedPrecondition for a refusal that --force-like options lift), so a caller can
// branch on them.
//
// Nothing here talks to the shim or the snapshotter directly: a checkpoint is the task API's
// Checkpoint with containerd's runc options (an image directory the shim writes), a rollback is
// a task Update carrying checkpoint.RollbackKey, and the record of a checkpoint is its lease
// (pkg/checkpoint). A pod checkpoint is those calls on every container of a pod, frozen first with
// the task API's Pause, plus CRI's API for the pod's configuration and for a fork's new sandbox
// (pkg/podckpt). docs/client.md has a runnable example.
package client

import (
	"context"
	"fmt"
	"os"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// Client is cklite's client of one containerd namespace.
type Client struct {
	ctrd      *containerd.Client
	namespace string
	owned     bool // Close closes ctrd
}

// New connects to the containerd at address (a socket path, or unix://path) and works in
// namespace.
func New(address, namespace string) (*Client, error) {
	// containerd's client would retry a missing socket until its 10 s timeout.
	if _, err := os.Stat(strings.TrimPrefix(address, "unix://")); err != nil {
		return nil, fmt.Errorf("containerd's socket: %w (is containerd running?)", err)
	}
	ctrd, err := containerd.New(address, containerd.WithDefaultNamespace(namespace))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
	}
	return &Client{ctrd: ctrd, namespace: namespace, owned: true}, nil
}

// FromContainerd works in namespace through a containerd client the caller already has (and
// closes: Close leaves it open).
func FromContainerd(ctrd *containerd.Client, namespace string) *Client {
	return &Client{ctrd: ctrd, namespace: namespace}
}

// Close closes the connection New made.
func (c *Client) Close() error {
	if c.owned {
		return c.ctrd.Close()
	}
	return nil
}

// Containerd is the containerd client underneath, for what cklite does not wrap (creating the
// sandbox container, exec, images).
func (c *Client) Containerd() *containerd.Client { return c.ctrd }

// Namespace is the containerd namespace the client works in.
func (c *Client) Namespace() string { return c.namespace }

// Context is ctx in the client's namespace, for calls through Containerd.
func (c *Client) Context(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, c.namespace)
}
