package runtime

import (
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
)

// A checkpoint leaves the container's network namespace out of the CRIU dump as an external
// namespace, the way libcontainer does for a namespace the spec names by path (a CRI pod's):
// CRIU does not dump network devices anyway, and an external namespace can be handed back to the
// restore. The in-place restore of a leave-running checkpoint gets the very namespace the
// processes left, held open across the dump: same interfaces, addresses and routes, lo up, and
// established TCP connections restorable. A restore into a new task gets the namespace the spec
// names, or a new one with lo up (which CNI hooks then configure, as at create).

// HasNetNS reports whether the container runs in a network namespace other than the host's:
// one the spec created, or one it names (a CRI pod's).
func (c *Container) HasNetNS() bool {
	cfg := c.lc.Config()
	return cfg.Namespaces.Contains(configs.NEWNET)
}

// nameNetNS makes cfg name the container's network namespace, so that a dump leaves it out as
// external (libcontainer does so for a namespace the configuration names by path). One the spec
// created is named by init's /proc path; it reports whether cfg changed.
func nameNetNS(cfg *configs.Config, initPid int) (bool, error) {
	if !cfg.Namespaces.Contains(configs.NEWNET) {
		return false, nil // the host's network
	}
	path := cfg.Namespaces.PathOf(configs.NEWNET)
	if path != "" && !strings.HasPrefix(path, "/proc/") {
		return false, nil // a namespace the spec names (a CRI pod's)
	}
	if initPid == 0 {
		return false, fmt.Errorf("container has no init to find its network namespace")
	}
	own := fmt.Sprintf("/proc/%d/ns/net", initPid)
	if path == own {
		return false, nil
	}
	cfg.Namespaces.Add(configs.NEWNET, own)
	return true, nil
}

// OpenNetNS opens the network namespace of process pid: holding it keeps the namespace, its
// devices and their addresses alive while no process is in it.
func OpenNetNS(pid int) (*os.File, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, fmt.Errorf("open network namespace of %d: %w", pid, err)
	}
	return f, nil
}

// NewNetNS creates a network namespace with lo up, held by the returned file.
//
// The namespace is entered by a thread that then ends with its goroutine, and never by the main
// thread: /proc/self/ns/net is the main thread's, and libcontainer compares a configuration's
// network namespace against it to tell the host's. Made on the main thread, a fork's new
// namespace passed for the host's ("sysctl ... not allowed in host network namespace"), and the
// main thread stayed in it.
func NewNetNS() (*os.File, error) {
	var f *os.File
	err := offMainThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("create network namespace: %w", err)
		}
		if err := loUp(); err != nil {
			return err
		}
		var err error
		f, err = os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		return err
	})
	return f, err
}

// offMainThread runs fn on a locked thread other than the main one, which ends when fn returns:
// fn may leave the thread in namespaces of its own.
func offMainThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// While this goroutine holds the main thread, the next one runs on another.
			done <- offMainThread(fn)
			goruntime.UnlockOSThread()
			return
		}
		// Not unlocked: Go ends the thread with the goroutine instead of reusing it.
		done <- fn()
	}()
	return <-done
}

// loUp brings up the loopback device of the calling thread's network namespace.
func loUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket to set lo up: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("flags of lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

// WithNetNS makes a configuration's network namespace the one held by f, for a restore of a
// dump that left it out (libcontainer hands the path's namespace to CRIU).
func WithNetNS(cfg *configs.Config, f *os.File) {
	cfg.Namespaces.Add(configs.NEWNET, fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd()))
}

// SpecNetNS reports whether the configuration joins a network namespace by path, and whether it
// has one of its own at all.
func SpecNetNS(cfg *configs.Config) (named, private bool) {
	if !cfg.Namespaces.Contains(configs.NEWNET) {
		return false, false
	}
	return cfg.Namespaces.PathOf(configs.NEWNET) != "", true
}

// HasTCPSockets reports whether the network namespace of process pid holds TCP sockets of any
// state (listening, connected, closing): those a dump must keep from seeing or sending resets.
// It reads the namespace's socket counters: /proc/PID/net/tcp would list every socket, walking the
// host's whole TCP hash table (~4 ms for each of tcp and tcp6 here) on every checkpoint.
func HasTCPSockets(pid int) (bool, error) {
	for _, table := range []struct{ file, proto string }{{"sockstat", "TCP"}, {"sockstat6", "TCP6"}} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table.file))
		if os.IsNotExist(err) {
			continue // no IPv6
		}
		if err != nil {
			return false, fmt.Errorf("TCP sockets of %d: %w", pid, err)
		}
		n, err := socketsInUse(string(data), table.proto)
		if err != nil {
			return false, fmt.Errorf("TCP sockets of %d: /proc/%d/net/%s: %w", pid, pid, table.file, err)
		}
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}

// socketsInUse reads the "inuse" count of proto's line in a sockstat file ("TCP: inuse 4 orphan
// 0 ..."), a count the kernel keeps for each network namespace.
func socketsInUse(sockstat, proto string) (int, error) {
	for _, line := range strings.Split(sockstat, "\n") {
		rest, ok := strings.CutPrefix(line, proto+": inuse ")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, " ")
		return strconv.Atoi(n)
	}
	return 0, fmt.Errorf("no %q line", proto+": inuse")
}
