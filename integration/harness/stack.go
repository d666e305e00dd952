// Package harness runs a private containerd for cklite's integration tests, benchmark and demo:
// its own root, state and socket under a fresh directory, the binaries that `make deps` installed,
// optionally the cklite shim and snapshotter, a local registry, and helpers to drive it with the
// real nerdctl, ctr and containerd Go client. Everything it starts it tears down again (processes,
// mounts, cgroups, files), and a run that was killed before it could is swept by the next one.
package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cklite/cklite/integration/harness/hostcheck"
)

// DefaultPrefix is where contrib/install.sh installs the stack.
const DefaultPrefix = "/opt/cklite"

// Stack locates the binaries the harness drives.
type Stack struct {
	// Bin holds containerd, ctr, containerd-shim-runc-v2, runc, nerdctl, criu, registry and crane.
	Bin string
	// CNIBin holds the CNI plugins.
	CNIBin string
	// ProjectBin holds cklite's own binaries (containerd-shim-cklite-v2, cklite-snapshotter, cklite)
	// as `make build` leaves them; it comes first on the daemon's PATH so containerd finds the shim.
	ProjectBin string
}

// requiredBins are what `make deps` installs into Stack.Bin.
var requiredBins = []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc", "nerdctl", "criu", "registry", "crane"}

// LoadStack finds the installed stack under $CKLITE_PREFIX (default /opt/cklite) and the project's
// binaries under $CKLITE_BIN (default bin/ at the module root) and checks nothing is missing.
func LoadStack() (*Stack, error) {
	prefix := envOr("CKLITE_PREFIX", DefaultPrefix)
	s := &Stack{Bin: filepath.Join(prefix, "bin"), CNIBin: filepath.Join(prefix, "cni", "bin")}
	var missing []string
	for _, b := range requiredBins {
		if !executable(filepath.Join(s.Bin, b)) {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s missing from %s: run 'make deps' (contrib/install.sh) first", strings.Join(missing, ", "), s.Bin)
	}
	if !executable(filepath.Join(s.CNIBin, "bridge")) {
		return nil, fmt.Errorf("CNI plugins missing from %s: run 'make deps' first", s.CNIBin)
	}
	if dir := os.Getenv("CKLITE_BIN"); dir != "" {
		s.ProjectBin = dir
	} else if root, err := moduleRoot(); err == nil {
		s.ProjectBin = filepath.Join(root, "bin")
	}
	return s, nil
}

// Path returns the PATH the daemon and the CLIs run with: the project's binaries, then the stack,
// then the system. runc and libcontainer find criu only through PATH.
func (s *Stack) Path() string {
	parts := []string{s.Bin, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}
	if s.ProjectBin != "" {
		parts = append([]string{s.ProjectBin}, parts...)
	}
	return strings.Join(parts, ":")
}

// Has reports whether the project's binary name has been built.
func (s *Stack) Has(name string) bool {
	return s.ProjectBin != "" && executable(filepath.Join(s.ProjectBin, name))
}

// moduleRoot walks up from the working directory to the folder holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// CheckCRIU verifies the stack's criu is recent enough and passes `criu check` on this kernel.
func (s *Stack) CheckCRIU(ctx context.Context) (hostcheck.CRIUVersion, error) {
	return hostcheck.CRIU(ctx, filepath.Join(s.Bin, "criu"))
}
