// Package setup writes the configuration of a cklite instance under one root directory, and
// starts and stops its daemons: what `cklite setup` and `cklite daemon` do.
//
// A private instance is a containerd of its own with cklite's shim, snapshotter and differ
// registered, a cklite-snapshotter serving it, and nerdctl pointed at both, everything below the
// root:
//
//	ROOT/etc/containerd.toml          containerd's configuration; imports etc/containerd-cklite.toml
//	ROOT/etc/containerd-cklite.toml   what registers cklite: proxy snapshotter and differ, CRI handler
//	ROOT/etc/snapshotter.toml         cklite-snapshotter's
//	ROOT/etc/shim.toml                the shim's and the CLI's (state_dir)
//	ROOT/etc/nerdctl.toml             nerdctl's: address, snapshotter cklite, data root, CNI
//	ROOT/etc/cni/net.d/               nerdctl's default network: a bridge and subnet of its own
//	ROOT/env                          the environment to drive it: . ROOT/env
//	ROOT/run/                         sockets, containerd's state, pid files
//	ROOT/lib/                         containerd's root, the snapshotter's, cklite's state, nerdctl's
//	ROOT/log/                         the daemons' logs
//
// For a containerd that already runs, the same root holds only what cklite adds to it: the
// snippet containerd imports, the snapshotter's configuration and state, nerdctl.toml and env.
package setup

import (
	"fmt"
	"path/filepath"
)

// Layout is where an instance under Root keeps each of its files.
type Layout struct {
	Root string
}

func (l Layout) path(elem ...string) string {
	return filepath.Join(append([]string{l.Root}, elem...)...)
}

func (l Layout) ContainerdConfig() string  { return l.path("etc", "containerd.toml") }
func (l Layout) CkliteSnippet() string     { return l.path("etc", "containerd-cklite.toml") }
func (l Layout) SnapshotterConfig() string { return l.path("etc", "snapshotter.toml") }
func (l Layout) ShimConfig() string        { return l.path("etc", "shim.toml") }
func (l Layout) NerdctlConfig() string     { return l.path("etc", "nerdctl.toml") }
func (l Layout) CNIConfDir() string        { return l.path("etc", "cni", "net.d") }
func (l Layout) NetworkConfig() string {
	return l.path("etc", "cni", "net.d", "nerdctl-bridge.conflist")
}
func (l Layout) Env() string { return l.path("env") }

func (l Layout) ContainerdAddress() string  { return l.path("run", "containerd.sock") }
func (l Layout) ContainerdState() string    { return l.path("run", "containerd") }
func (l Layout) SnapshotterAddress() string { return l.path("run", "snapshotter.sock") }
func (l Layout) PIDFile(daemon string) string {
	return l.path("run", daemon+".pid")
}

func (l Layout) ContainerdRoot() string  { return l.path("lib", "containerd") }
func (l Layout) SnapshotterRoot() string { return l.path("lib", "snapshotter") }
func (l Layout) StateDir() string        { return l.path("lib", "cklite") }
func (l Layout) NerdctlDataRoot() string { return l.path("lib", "nerdctl") }
func (l Layout) Temp() string            { return l.path("tmp") }
func (l Layout) Log(daemon string) string {
	return l.path("log", daemon+".log")
}

// maxSocketPath is the longest path a unix socket address holds (sun_path less its NUL).
const maxSocketPath = 107

// checkSocket refuses a socket path the kernel cannot bind: containerd would fail at start with
// a less obvious error, and its ttrpc socket is the gRPC one with ".ttrpc" added.
func checkSocket(path string) error {
	if len(path) > maxSocketPath {
		return fmt.Errorf("socket path %s is %d bytes long, more than a unix socket takes (%d): choose a shorter root", path, len(path), maxSocketPath)
	}
	return nil
}
