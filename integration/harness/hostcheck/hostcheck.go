// Package hostcheck verifies what cklite needs from the machine it runs on: root, a kernel with
// overlayfs, and a CRIU that is new enough and passes `criu check` on this kernel. Every error names
// the missing piece, so an operator can act on it without reading logs.
package hostcheck

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// MinCRIUMajor is the oldest CRIU major version cklite accepts. Debian bookworm's CRIU 3.17 fails
// `criu check` on current kernels (vdso) and lacks fixes cklite relies on.
const MinCRIUMajor = 4

var (
	// ErrNotRoot is returned when the process lacks the privileges to mount and run containers.
	ErrNotRoot = errors.New("must run as root")
	// ErrNoOverlay is returned when the kernel does not offer overlayfs.
	ErrNoOverlay = errors.New("kernel has no overlayfs")
	// ErrCRIU is returned when CRIU is missing, too old or failing on this kernel.
	ErrCRIU = errors.New("CRIU unusable")
)

// Root reports whether the process runs as root.
func Root() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w (euid %d)", ErrNotRoot, os.Geteuid())
	}
	return nil
}

// Overlay reports whether overlayfs is registered with the kernel.
func Overlay() error {
	return overlayIn("/proc/filesystems")
}

func overlayIn(procFilesystems string) error {
	data, err := os.ReadFile(procFilesystems)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoOverlay, err)
	}
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 0 && fields[len(fields)-1] == "overlay" {
			return nil
		}
	}
	return fmt.Errorf("%w: not listed in %s (try 'modprobe overlay')", ErrNoOverlay, procFilesystems)
}

// CRIUVersion is a CRIU release number.
type CRIUVersion struct {
	Major, Minor, Patch int
}

func (v CRIUVersion) String() string {
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
}

// ParseCRIUVersion reads the "Version: X.Y[.Z]" line that `criu --version` prints.
func ParseCRIUVersion(out string) (CRIUVersion, error) {
	for _, line := range strings.Split(out, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "Version:")
		if !ok {
			continue
		}
		parts := strings.Split(strings.TrimSpace(rest), ".")
		if len(parts) < 2 || len(parts) > 3 {
			break
		}
		var nums [3]int
		for i, p := range parts {
			n, err := strconv.Atoi(p)
			if err != nil || n < 0 {
				return CRIUVersion{}, fmt.Errorf("malformed CRIU version %q", strings.TrimSpace(rest))
			}
			nums[i] = n
		}
		return CRIUVersion{nums[0], nums[1], nums[2]}, nil
	}
	return CRIUVersion{}, fmt.Errorf("no 'Version:' line in criu --version output %q", strings.TrimSpace(out))
}

// CRIU checks that the criu binary at path (or found on PATH when path has no slash) is at least
// MinCRIUMajor and that `criu check` passes on this kernel.
func CRIU(ctx context.Context, path string) (CRIUVersion, error) {
	bin, err := exec.LookPath(path)
	if err != nil {
		return CRIUVersion{}, fmt.Errorf("%w: %s not found: %w", ErrCRIU, path, err)
	}
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return CRIUVersion{}, fmt.Errorf("%w: %s --version: %w: %s", ErrCRIU, bin, err, bytes.TrimSpace(out))
	}
	v, err := ParseCRIUVersion(string(out))
	if err != nil {
		return CRIUVersion{}, fmt.Errorf("%w: %s: %w", ErrCRIU, bin, err)
	}
	if v.Major < MinCRIUMajor {
		return v, fmt.Errorf("%w: %s is version %s, need >= %d.0 (run 'make deps' to build one)", ErrCRIU, bin, v, MinCRIUMajor)
	}
	if out, err := exec.CommandContext(ctx, bin, "check").CombinedOutput(); err != nil {
		return v, fmt.Errorf("%w: '%s check' fails on this kernel: %w: %s", ErrCRIU, bin, err, lastLines(out, 5))
	}
	return v, nil
}

// lastLines keeps the tail of a tool's output, where its verdict is.
func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}
