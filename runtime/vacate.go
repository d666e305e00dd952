package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
)

// vacateWait bounds Vacate's wait for the cgroups to empty. A container in its own PID namespace
// has none left once its init's exit is seen (the kernel reaps the namespace first); one that
// shares the host's is given the time Destroy would give it.
const vacateWait = 2 * time.Second

// errResourcesUpdated refuses to vacate a container whose limits were changed by Update.
var errResourcesUpdated = errors.New("resources updated since the cgroups were created")

// Vacate ends the libcontainer container of a task whose processes are gone, but keeps its
// cgroups for the next container of the same id and configuration (Create, then Restore: an
// in-place rollback). Destroy would remove every cgroup v1 hierarchy (~12 directories) and the
// next Restore would make them again and write every limit into fresh ones; kept, the restore's
// Apply and Set find them in place and the device rules already as they must be.
//
// What the next restore sees is what it would after Destroy: empty cgroups with no child cgroups,
// thawed, no state directory, the poststop hooks run. Only limits differ between a kept cgroup
// and a fresh one when Update changed them (a limit the configuration leaves unset would stay),
// so a container whose resources were updated is refused: the caller destroys it instead.
// Vacate refuses with errdefs.ErrFailedPrecondition and changes nothing when the cgroups do not
// empty within vacateWait; the caller then destroys the container as before. Once the state
// directory is gone a killed shim's cleanup (Recover) still finds the cgroups through the spec.
func (c *Container) Vacate() error {
	if c.updated {
		return fmt.Errorf("vacate container: %w: %w", errResourcesUpdated, errdefs.ErrFailedPrecondition)
	}
	st, err := c.lc.State()
	if err != nil {
		return wrap("vacate container", err)
	}
	paths := uniquePaths(st.CgroupPaths)
	if err := waitEmpty(paths, vacateWait); err != nil {
		return fmt.Errorf("vacate container: %w", err)
	}
	c.guard.drop()
	if status, err := c.lc.Status(); err != nil || status != libcontainer.Stopped {
		return fmt.Errorf("vacate container: status %v (%v): %w", status, err, errdefs.ErrFailedPrecondition)
	}
	for _, p := range paths {
		if err := removeChildCgroups(p); err != nil {
			return fmt.Errorf("vacate container: %w", err)
		}
	}
	if err := c.poststop(); err != nil {
		return fmt.Errorf("vacate container: %w", err)
	}
	return removeState(filepath.Join(c.root, c.lc.ID()))
}

// poststop runs the configuration's poststop hooks, as libcontainer's Destroy does.
func (c *Container) poststop() error {
	cfg := c.lc.Config()
	if cfg.Hooks == nil || len(cfg.Hooks[configs.Poststop]) == 0 {
		return nil
	}
	s, err := c.lc.OCIState()
	if err != nil {
		return wrap("state for poststop hooks", err)
	}
	s.Status = "stopped"
	return cfg.Hooks.Run(configs.Poststop, s)
}

// uniquePaths lists the container's cgroup directories once each (cpu and cpuacct share one).
func uniquePaths(byController map[string]string) []string {
	var paths []string
	for _, p := range byController {
		if p != "" && !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	return paths
}

// waitEmpty waits until no process is left in the cgroups at paths (or under them), up to limit,
// killing what it finds there as libcontainer's Destroy does (a process of a shared PID namespace
// may have forked past the task's kill).
func waitEmpty(paths []string, limit time.Duration) error {
	for deadline := time.Now().Add(limit); ; time.Sleep(5 * time.Millisecond) {
		busy, pids, err := firstBusy(paths)
		if err != nil || busy == "" {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still holds processes after %v: %w", busy, limit, errdefs.ErrFailedPrecondition)
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

// firstBusy is the first of paths whose cgroup (or a child of it) holds processes, and those
// processes, or "".
func firstBusy(paths []string) (string, []int, error) {
	for _, p := range paths {
		pids, err := cgroups.GetAllPids(p)
		if errors.Is(err, os.ErrNotExist) {
			return "", nil, fmt.Errorf("cgroup %s is gone: %w", p, errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return "", nil, fmt.Errorf("processes of cgroup %s: %w", p, err)
		}
		if len(pids) > 0 {
			return p, pids, nil
		}
	}
	return "", nil, nil
}

// removeChildCgroups removes the cgroups the container's processes made under its own: a restore
// into a fresh cgroup finds none, and CRIU creates (and configures) those its images hold.
func removeChildCgroups(path string) error {
	entries, err := os.ReadDir(path)
	if err != nil {
		return fmt.Errorf("child cgroups of %s: %w", path, err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if err := cgroups.RemovePath(filepath.Join(path, e.Name())); err != nil {
			return fmt.Errorf("remove child cgroup: %w", err)
		}
	}
	return nil
}
