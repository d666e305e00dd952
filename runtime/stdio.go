package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Stdio returns the identities of the init's stdin, stdout and stderr as libcontainer recorded
// them when it started or restored the init ("pipe:[N]", "/dev/null", ...; "" where unknown).
// They are what a dump writes into descriptors.json and what a restore maps the restoring
// runtime's own stdio onto (CRIU's inherit-fd), and unlike the init's fds 0-2 they do not change
// while the init runs: a shell running a builtin with a redirection has its fd 1 on the file for
// a moment, with the pipe parked on a higher fd.
func (c *Container) Stdio() ([]string, error) {
	st, err := c.lc.State()
	if err != nil {
		return nil, wrap("container state", err)
	}
	names := make([]string, 3)
	copy(names, st.ExternalDescriptors)
	return names, nil
}

// OpenPipe opens, with flag, the pipe named name ("pipe:[N]") through whichever fd of the
// processes pids refers to it first. It returns nil when none does.
func OpenPipe(name string, flag int, pids []int) (*os.File, error) {
	ino, ok := pipeInode(name)
	if !ok {
		return nil, fmt.Errorf("%q does not name a pipe", name)
	}
	for _, pid := range pids {
		f, err := openPipeOf(pid, name, ino, flag)
		if f != nil || err != nil {
			return f, err
		}
	}
	return nil, nil
}

// openPipeOf looks for name among pid's fds; a process gone meanwhile has none.
func openPipeOf(pid int, name string, ino uint64, flag int) (*os.File, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if target, err := os.Readlink(path); err != nil || target != name {
			continue
		}
		f, err := os.OpenFile(path, flag, 0)
		if err != nil {
			continue // closed in between
		}
		// The fd may have been closed and reused between the readlink and the open.
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err == nil && st.Ino == ino && st.Mode&unix.S_IFMT == unix.S_IFIFO {
			return f, nil
		}
		f.Close()
	}
	return nil, nil
}

// IsPipeName reports whether name is a pipe's identity, "pipe:[N]".
func IsPipeName(name string) bool {
	_, ok := pipeInode(name)
	return ok
}

// pipeInode parses "pipe:[N]".
func pipeInode(name string) (uint64, bool) {
	s, ok := strings.CutPrefix(name, "pipe:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}
