package fork

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// A fork is a container of its own as nerdctl sees it: a random 64-hex id (a name is matched
// whole, an id by prefix, so no container's name can make `nerdctl exec NAME` ambiguous with a
// fork), its name in the label nerdctl/name and in nerdctl's name store, and, when nerdctl made the
// original, a state directory of its own with copies of the original's /etc/hosts, /etc/resolv.conf
// and /etc/hostname (nerdctl bind-mounts them from the original's directories, which `nerdctl rm`
// of the original deletes), the original's log driver, and its own hostname. `nerdctl ps`, `exec`,
// `logs` and `rm` then treat a fork as any container, and a fork needs nothing of the original
// container once it runs: only the checkpoint's frozen layers, which leases keep.

// nerdctl's labels (github.com/containerd/nerdctl/v2/pkg/labels); nerdctl also copies them into
// the spec's annotations, where its OCI hooks read them.
const (
	nerdctlPrefix    = "nerdctl/"
	nerdctlName      = nerdctlPrefix + "name"
	nerdctlNamespace = nerdctlPrefix + "namespace"
	nerdctlStateDir  = nerdctlPrefix + "state-dir"
	nerdctlHostname  = nerdctlPrefix + "hostname"
	nerdctlLogURI    = nerdctlPrefix + "log-uri"
	nerdctlNetworks  = nerdctlPrefix + "networks"
	// nerdctlLogPath is the json-file driver's option naming its file (default
	// <state dir>/<id>-json.log), in log-config.json.
	nerdctlLogPath = "log-path"
)

// keptNerdctlLabels are the original's nerdctl labels a fork keeps as they are: they describe how
// it runs, not what it owns. Those naming what the original owns (its addresses, ports, MAC,
// volumes, IPC directory, pid file) are dropped: `nerdctl rm` of the fork would free them.
var keptNerdctlLabels = []string{
	nerdctlLogURI, nerdctlPrefix + "log-config", nerdctlPrefix + "platform", nerdctlPrefix + "extraHosts",
	nerdctlPrefix + "mounts", nerdctlPrefix + "stop-timeout", nerdctlPrefix + "user", nerdctlPrefix + "dns",
	nerdctlPrefix + "host-config", nerdctlPrefix + "domainname",
}

// etcFiles are the files nerdctl bind-mounts into a container from its data root.
var etcFiles = []string{"/etc/hosts", "/etc/resolv.conf", "/etc/hostname"}

// newID is a fork's container id: 64 random hex digits, as nerdctl's.
func newID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}

// nerdctlStore is nerdctl's data store of one namespace ("/var/lib/nerdctl/<address hash>"):
// containers/<ns>/<id> (a container's state directory), etchosts/<ns>/<id> (its hosts file),
// names/<ns>/<name> (the id holding the name).
type nerdctlStore struct {
	dataStore, namespace string
}

// storeOf finds the data store of the nerdctl container c from its state directory; ok is false
// when nerdctl did not make c.
func storeOf(c containers.Container) (s nerdctlStore, ok bool) {
	dir := c.Labels[nerdctlStateDir]
	if dir == "" || filepath.Base(dir) != c.ID {
		return nerdctlStore{}, false
	}
	ns := filepath.Dir(dir)
	if filepath.Base(filepath.Dir(ns)) != "containers" {
		return nerdctlStore{}, false
	}
	return nerdctlStore{dataStore: filepath.Dir(filepath.Dir(ns)), namespace: filepath.Base(ns)}, true
}

func (s nerdctlStore) stateDir(id string) string {
	return filepath.Join(s.dataStore, "containers", s.namespace, id)
}

func (s nerdctlStore) hostsDir(id string) string {
	return filepath.Join(s.dataStore, "etchosts", s.namespace, id)
}

// withNames runs fn holding the lock nerdctl's name store takes (flock of its directory).
func (s nerdctlStore) withNames(fn func(dir string) error) error {
	dir := filepath.Join(s.dataStore, "names", s.namespace)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("nerdctl's name store: %w", err)
	}
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("nerdctl's name store: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock nerdctl's name store: %w", err)
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN) //nolint:errcheck
	return fn(dir)
}

// acquire gives name to container id in nerdctl's name store, as `nerdctl run --name` does.
func (s nerdctlStore) acquire(name, id string) error {
	return s.withNames(func(dir string) error {
		owner, err := os.ReadFile(filepath.Join(dir, name))
		switch {
		case err == nil && len(owner) > 0 && string(owner) != id:
			return fmt.Errorf("name %s is held by container %s in nerdctl's name store: %w", name, owner, errdefs.ErrAlreadyExists)
		case err != nil && !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("nerdctl's name store: %w", err)
		}
		return os.WriteFile(filepath.Join(dir, name), []byte(id), 0o600)
	})
}

// release frees name if container id holds it.
func (s nerdctlStore) release(name, id string) error {
	return s.withNames(func(dir string) error {
		owner, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) || (err == nil && string(owner) != id) {
			return nil
		}
		if err != nil {
			return err
		}
		return os.Remove(filepath.Join(dir, name))
	})
}

// identity is what a fork owns: its id, name and hostname, and, for a fork of a nerdctl
// container, its state in nerdctl's store.
type identity struct {
	id, name, hostname string
	store              *nerdctlStore
}

// ownFiles makes fork f's copies of the original's /etc files that live in the original's nerdctl
// directories (its own hostname written into them) and returns the spec's mount sources to
// replace. Files from elsewhere (a user's bind mount) stay shared, as they are for any container.
func (f identity) ownFiles(original containers.Container, spec *specs.Spec) (map[string]string, error) {
	if f.store == nil {
		return nil, nil
	}
	dirs := map[string]string{
		f.store.stateDir(original.ID): f.store.stateDir(f.id),
		f.store.hostsDir(original.ID): f.store.hostsDir(f.id),
	}
	oldHostname := original.Labels[nerdctlHostname]
	if oldHostname == "" {
		oldHostname = spec.Hostname
	}
	moved := map[string]string{}
	for _, m := range spec.Mounts {
		if !isEtcFile(m.Destination) {
			continue
		}
		for from, to := range dirs {
			rel, err := filepath.Rel(from, m.Source)
			if err != nil || strings.HasPrefix(rel, "..") {
				continue
			}
			data, err := os.ReadFile(m.Source)
			if err != nil {
				return nil, fmt.Errorf("%s of container %s: %w", m.Destination, original.ID, err)
			}
			switch m.Destination {
			case "/etc/hostname":
				data = []byte(f.hostname + "\n")
			case "/etc/hosts":
				data = renameHost(data, oldHostname, f.hostname, original.Labels[nerdctlName], f.name)
			}
			dest := filepath.Join(to, rel)
			if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(dest, data, 0o644); err != nil {
				return nil, fmt.Errorf("the fork's own %s: %w", m.Destination, err)
			}
			moved[m.Source] = dest
		}
	}
	return moved, f.ownLogConfig(original)
}

// ownLogConfig gives fork f the original's log driver: nerdctl's logging binary (the original's
// log URI, which the fork keeps) reads it from log-config.json in the container's state
// directory. For the json-file driver it also makes the fork's empty log file, as `nerdctl run`
// does (the driver's Init): the binary makes it only when it writes a first line, and until then
// `nerdctl logs` fails. A log-path option is left out: it names the original's file.
func (f identity) ownLogConfig(original containers.Container) error {
	data, err := os.ReadFile(filepath.Join(f.store.stateDir(original.ID), "log-config.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("log configuration of container %s: %w", original.ID, err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("log configuration of container %s: %w", original.ID, err)
	}
	if opts, ok := cfg["opts"].(map[string]any); ok && opts[nerdctlLogPath] != nil {
		delete(opts, nerdctlLogPath)
		if data, err = json.Marshal(cfg); err != nil {
			return err
		}
	}
	dir := f.store.stateDir(f.id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "log-config.json"), data, 0o600); err != nil {
		return fmt.Errorf("the fork's log configuration: %w", err)
	}
	if cfg["driver"] == "json-file" {
		if err := os.WriteFile(filepath.Join(dir, f.id+"-json.log"), nil, 0o600); err != nil {
			return fmt.Errorf("the fork's log file: %w", err)
		}
	}
	return nil
}

// removeFiles removes what ownFiles and acquire made for fork f.
func (f identity) removeFiles() error {
	if f.store == nil {
		return nil
	}
	return errors.Join(
		os.RemoveAll(f.store.stateDir(f.id)),
		os.RemoveAll(f.store.hostsDir(f.id)),
		f.store.release(f.name, f.id),
	)
}

func isEtcFile(dest string) bool {
	for _, e := range etcFiles {
		if dest == e {
			return true
		}
	}
	return false
}

// renameHost replaces, in a hosts file, the original's hostname and name by the fork's, where
// they stand as whole names.
func renameHost(hosts []byte, oldHost, newHost, oldName, newName string) []byte {
	lines := bytes.Split(hosts, []byte("\n"))
	for i, l := range lines {
		fields := strings.Fields(string(l))
		if len(fields) < 2 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		changed := false
		for j, name := range fields[1:] {
			switch {
			case oldHost != "" && name == oldHost:
				fields[j+1], changed = newHost, true
			case oldName != "" && name == oldName:
				fields[j+1], changed = newName, true
			}
		}
		if changed {
			lines[i] = []byte(strings.Join(fields, "\t"))
		}
	}
	return bytes.Join(lines, []byte("\n"))
}

// setHostname sets the hostname of the UTS namespace of process pid: CRIU restores the
// original's, and a fork has its own.
func setHostname(pid uint32, hostname string) error {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/uts", pid))
	if err != nil {
		return fmt.Errorf("UTS namespace of the fork: %w", err)
	}
	defer ns.Close()
	done := make(chan error, 1)
	go func() {
		// The thread enters the fork's namespace and ends with the goroutine: never unlocked.
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWUTS); err != nil {
			done <- fmt.Errorf("enter the fork's UTS namespace: %w", err)
			return
		}
		done <- unix.Sethostname([]byte(hostname))
	}()
	if err := <-done; err != nil {
		return fmt.Errorf("set the fork's hostname: %w", err)
	}
	return nil
}
