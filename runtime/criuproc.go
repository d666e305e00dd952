package runtime

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/criuwrap"
)

// A CRIU process must not outlive the shim that started it: a dump orphaned by a killed shim
// keeps the container's processes ptrace-held, a restore orphan blocks forever on its broken RPC
// socket, and neither is ever reaped (issue 16 item 3). libcontainer runs CRIU as "criu" from
// PATH with no way to set the child's attributes, so the shim puts a "criu" of its own first in
// PATH: the wrapper (pkg/criuwrap, in the static cklite-exec-helper), which sets a parent-death
// signal and executes the real CRIU (the signal survives the exec). What a shim killed before
// this existed left behind is ended by EndCRIUOrphans when the container is cleaned up or
// created again.

// InstallCRIUWrapper makes every later "criu" run by this process (libcontainer's included) the
// wrapper, whose binary is wrapper: dir gets a "criu" link to it and goes first in PATH.
func InstallCRIUWrapper(dir, wrapper string) error {
	real, err := exec.LookPath(criuwrap.Name)
	if err != nil {
		return nil // findCRIU names the problem when a checkpoint needs CRIU
	}
	if real, err = filepath.Abs(real); err != nil {
		return err
	}
	if dir, err = filepath.Abs(dir); err != nil { // PATH must not hold relative entries
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("CRIU wrapper directory: %w", err)
	}
	link := filepath.Join(dir, criuwrap.Name)
	tmp := link + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(wrapper, tmp); err != nil {
		return fmt.Errorf("CRIU wrapper: %w", err)
	}
	if err := os.Rename(tmp, link); err != nil {
		return fmt.Errorf("CRIU wrapper: %w", err)
	}
	for k, v := range map[string]string{
		criuwrap.RealEnv:   real,
		criuwrap.ParentEnv: strconv.Itoa(os.Getpid()),
		"PATH":             dir + string(os.PathListSeparator) + os.Getenv("PATH"),
	} {
		if err := os.Setenv(k, v); err != nil {
			return err
		}
	}
	return nil
}

// EndCRIUOrphans kills every CRIU process that ptrace-holds one of pids (a dump's victims) or
// has a file or its working directory below one of dirs (its log and images: the bundle's work
// directory, the container's state), and waits, up to a second, for them to be gone. It
// returns the pids it killed.
func EndCRIUOrphans(pids []int, dirs []string) ([]int, error) {
	victims := map[int]bool{}
	for _, pid := range pids {
		if tracer := tracerOf(pid); tracer > 0 && isCRIU(tracer) {
			victims[tracer] = true
		}
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || victims[pid] || !isCRIU(pid) {
			continue
		}
		if usesAny(pid, dirs) {
			victims[pid] = true
		}
	}
	var killed []int
	for pid := range victims {
		if err := unix.Kill(pid, unix.SIGKILL); err == nil {
			killed = append(killed, pid)
		}
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if !anyAlive(killed) {
			break
		}
	}
	return killed, nil
}

func isCRIU(pid int) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return err == nil && filepath.Base(strings.TrimSuffix(exe, " (deleted)")) == criuwrap.Name
}

// tracerOf is the pid ptrace-attached to pid, or 0.
func tracerOf(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "TracerPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// usesAny reports whether pid's working directory or one of its open files is below one of dirs.
func usesAny(pid int, dirs []string) bool {
	paths := []string{}
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil {
		paths = append(paths, cwd)
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	if fds, err := os.ReadDir(fdDir); err == nil {
		for _, fd := range fds {
			if target, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil {
				paths = append(paths, target)
			}
		}
	}
	for _, p := range paths {
		for _, d := range dirs {
			if d != "" && (p == d || strings.HasPrefix(p, d+"/")) {
				return true
			}
		}
	}
	return false
}

// anyAlive reports whether one of pids still exists (a zombie counts as gone).
func anyAlive(pids []int) bool {
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The state follows the command, which is in parentheses and may hold spaces.
		if i := strings.LastIndexByte(string(data), ')'); i > 0 && i+2 < len(data) && data[i+2] != 'Z' {
			return true
		}
	}
	return false
}
