// Package server puts cklite's snapshotter on a unix socket for containerd's proxy plugins.
package server

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Listen listens on the unix socket at address. A socket file left by a snapshotter that died is
// replaced; one that a live process still serves, or a path that is not a socket, is refused
// untouched.
func Listen(address string) (net.Listener, error) {
	if !filepath.IsAbs(address) {
		return nil, fmt.Errorf("socket address %q: must be an absolute path", address)
	}
	if err := os.MkdirAll(filepath.Dir(address), 0o711); err != nil {
		return nil, fmt.Errorf("socket directory for %s: %w", address, err)
	}
	st, err := os.Lstat(address)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("socket %s: %w", address, err)
	case st.Mode()&fs.ModeSocket == 0:
		return nil, fmt.Errorf("socket %s: the path exists and is not a socket (%s); remove it or choose another address", address, st.Mode().Type())
	default:
		if conn, err := net.DialTimeout("unix", address, time.Second); err == nil {
			conn.Close()
			return nil, fmt.Errorf("socket %s: another process is serving it (is cklite-snapshotter already running?)", address)
		}
		if err := os.Remove(address); err != nil {
			return nil, fmt.Errorf("removing stale socket %s: %w", address, err)
		}
	}
	l, err := net.Listen("unix", address)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", address, err)
	}
	return l, nil
}
