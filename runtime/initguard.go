package runtime

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
)

// initGuard holds a pidfd of the container's init from its start or restore to its destroy.
//
// libcontainer joins an exec to the namespaces of whatever pid its state names, and to none at
// all when it knows no init (pid 0: an empty namespace list): after a restore that failed or was
// killed halfway, an exec then ran in the host's mount, PID and network namespaces. A pidfd names
// one process for good (a pid may be reused once its owner is reaped), so an exec is let through
// only while the init it was taken of is alive and is the pid whose namespaces libcontainer will
// join, and only if every namespace the container was given is that init's.
type initGuard struct {
	mu  sync.Mutex
	fd  int // -1: no init to join
	pid int
}

func newInitGuard() *initGuard { return &initGuard{fd: -1} }

// hold takes a pidfd of pid, the new init, releasing the previous one.
func (g *initGuard) hold(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("container has no init process to hold: %w", errdefs.ErrFailedPrecondition)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd of init %d: %w", pid, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closeLocked()
	g.fd, g.pid = fd, pid
	return nil
}

// drop forgets the init: every later exec is refused until hold is called again.
func (g *initGuard) drop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closeLocked()
}

func (g *initGuard) closeLocked() {
	if g.fd >= 0 {
		unix.Close(g.fd)
	}
	g.fd, g.pid = -1, 0
}

// alive returns the held init's pid if it still runs (signal 0 through the pidfd), or an error
// naming why no process may join it.
func (g *initGuard) alive() (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fd < 0 {
		return 0, fmt.Errorf("the container has no running init (never started, exited, or its restore failed): %w", errdefs.ErrFailedPrecondition)
	}
	if err := unix.PidfdSendSignal(g.fd, 0, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return 0, fmt.Errorf("the container's init %d has exited: %w", g.pid, errdefs.ErrNotFound)
		}
		return 0, fmt.Errorf("check the container's init %d: %w", g.pid, err)
	}
	return g.pid, nil
}

// verify checks that joining st's namespaces joins the live init held by g: st names that init,
// every namespace of the container's config, and a namespace the container was to have of its own
// is not the shim's (the host's). The init is checked alive after the namespaces were read, so
// they were its own and not a reused pid's.
func (g *initGuard) verify(st *libcontainer.State) error {
	pid, err := g.alive()
	if err != nil {
		return err
	}
	if st.InitProcessPid != pid {
		return fmt.Errorf("the container's state names init %d, not the running init %d: %w", st.InitProcessPid, pid, errdefs.ErrFailedPrecondition)
	}
	if err := checkNamespaces(st.Config.Namespaces, st.NamespacePaths, pid); err != nil {
		return err
	}
	_, err = g.alive()
	return err
}

// checkNamespaces checks the namespace paths libcontainer would join (always init's,
// /proc/PID/ns/TYPE) against the container's namespaces: each one present and init's, and one the
// container was to make of its own (no path given) not the shim's own, the host's. A namespace
// given by path is the runtime's choice, which may be any.
func checkNamespaces(want configs.Namespaces, paths map[configs.NamespaceType]string, pid int) error {
	for _, ns := range want {
		path, ok := paths[ns.Type]
		if !ok || path == "" {
			return fmt.Errorf("no %s namespace to join for init %d: refusing to run a process in the host's: %w", ns.Type, pid, errdefs.ErrFailedPrecondition)
		}
		if exp := ns.GetPath(pid); path != exp {
			return fmt.Errorf("%s namespace %s is not init %d's (%s): %w", ns.Type, path, pid, exp, errdefs.ErrFailedPrecondition)
		}
		if ns.Path != "" {
			continue
		}
		same, err := sameFile(path, fmt.Sprintf("/proc/self/ns/%s", configs.NsName(ns.Type)))
		if err != nil {
			return fmt.Errorf("%s namespace of init %d: %w", ns.Type, pid, err)
		}
		if same {
			return fmt.Errorf("init %d is in the host's %s namespace, but the container has one of its own: refusing to join it: %w", pid, ns.Type, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

func sameFile(a, b string) (bool, error) {
	fa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	fb, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	return os.SameFile(fa, fb), nil
}

// verifyInit refuses a process that would join the container unless its init is live and verified.
func (c *Container) verifyInit() error {
	st, err := c.lc.State()
	if err != nil {
		return wrap("read container state", err)
	}
	if err := c.guard.verify(st); err != nil {
		return fmt.Errorf("container %s: %w", c.lc.ID(), err)
	}
	return nil
}
