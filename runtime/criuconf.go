package runtime

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/utils"
	"golang.org/x/sys/unix"
)

const (
	// criuConfigLabel is the annotation through which libcontainer hands CRIU a configuration
	// file; without it, libcontainer uses defaultCRIUConfig when that file exists.
	criuConfigLabel   = "org.criu.config"
	defaultCRIUConfig = "/etc/criu/runc.conf"
)

// Options cklite gives CRIU on top of the container's CRIU configuration. libcontainer has no
// field for them, but hands CRIU a configuration file (the spec's org.criu.config annotation, else
// /etc/criu/runc.conf): a copy of that file with the options added stands in for it.
const (
	// LeaveStopped makes a restore leave the restored tasks stopped (SIGSTOP) instead of
	// running, so that PauseStopped can freeze them before they execute an instruction. (Letting
	// CRIU restore a frozen freezer.state, its "full" cgroup mode, deadlocks: libcontainer puts
	// CRIU itself into the container's cgroups for the restore.)
	LeaveStopped = "leave-stopped"
	// NetworkLock* choose how CRIU keeps TCP peers from seeing resets while the sockets are
	// down. Its default, iptables, costs a restore ~130 ms here (iptables-restore runs); nftables
	// (when CRIU is built with it) ~20 ms; a namespace without TCP sockets needs no lock.
	NetworkLockSkip     = "network-lock skip"
	NetworkLockNftables = "network-lock nftables"
	// LeaveFrozen makes a successful leave-running dump leave the cgroup CRIU froze at its seize
	// frozen (contrib/criu/0008; a dump that fails thaws it): the rootfs is captured before the
	// task runs again, and the task was not frozen during CRIU's start. Only for a CRIU that has
	// it (CRIULeavesFrozen): PrepareDump adds it.
	LeaveFrozen = "leave-frozen"
	// leaveFrozenFeature is how `criu check --feature` names LeaveFrozen.
	leaveFrozenFeature = "leave_frozen"
)

var nftablesLock struct {
	once sync.Once
	ok   bool
}

// NftablesLockSupported reports whether criu can lock the network with nftables (it needs
// libnftables at build time and set concatenations in the kernel); asked once per process.
func NftablesLockSupported() bool {
	nftablesLock.once.Do(func() {
		nftablesLock.ok = exec.Command("criu", "check", "--feature", "network_lock_nftables").Run() == nil
	})
	return nftablesLock.ok
}

// originalCRIUConfigLabel keeps what stood in the org.criu.config label before cklite's options
// took its place: "named:FILE" for the spec's annotation, "default" for none.
const originalCRIUConfigLabel = "cklite.criu-config"

// WithCRIUOptions makes the CRIU runs of the container created with cfg use options, through a
// configuration file written into dir.
func WithCRIUOptions(cfg *configs.Config, dir string, options ...string) error {
	labels, original := ownCRIUConfig(cfg.Labels)
	base := ""
	if strings.HasPrefix(original, "named:") {
		base = strings.TrimPrefix(original, "named:")
	} else if _, err := os.Stat(defaultCRIUConfig); err == nil {
		base = defaultCRIUConfig
	}
	var data []byte
	if base != "" {
		var err error
		if data, err = os.ReadFile(base); err != nil {
			return fmt.Errorf("read CRIU configuration %s: %w", base, err)
		}
	}
	for _, o := range options {
		data = append(data, "\n"+o+"\n"...)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("CRIU work directory: %w", err)
	}
	conf := filepath.Join(dir, "cklite-criu.conf")
	if err := writeIfChanged(conf, data); err != nil {
		return fmt.Errorf("write CRIU configuration: %w", err)
	}
	cfg.Labels = append(labels, criuConfigLabel+"="+conf, originalCRIUConfigLabel+"="+original)
	return nil
}

// writeIfChanged writes data to the file path unless it holds it already: a dump's configuration
// is the same from one checkpoint of a container to the next (one file of the bundle), and
// reading it back costs less than truncating and writing it on every checkpoint.
func writeIfChanged(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return os.WriteFile(path, data, 0o600)
}

// ownCRIUConfig returns labels without the CRIU configuration labels, and the container's own
// CRIU configuration as originalCRIUConfigLabel records it.
func ownCRIUConfig(labels []string) ([]string, string) {
	original, ok := utils.SearchLabels(labels, originalCRIUConfigLabel)
	if !ok {
		original = "default"
		if file, named := utils.SearchLabels(labels, criuConfigLabel); named {
			original = "named:" + file
		}
	}
	return withoutLabel(withoutLabel(labels, criuConfigLabel), originalCRIUConfigLabel), original
}

func withoutLabel(labels []string, key string) []string {
	out := make([]string, 0, len(labels))
	for _, l := range labels {
		if !strings.HasPrefix(l, key+"=") {
			out = append(out, l)
		}
	}
	return out
}

// PrepareDump configures the container for its next dump, in at most one configuration update
// (it sits in every checkpoint's path): its own network namespace named so that the dump leaves
// it out as external, and exactly options given to CRIU through WithCRIUOptions, in a file of
// dir. Given the same dir every time, the file's path stays and a dump's options change only its
// contents, which CRIU reads at the dump: the configuration is updated (libcontainer's Set, which
// also rewrites every cgroup limit and the state file: milliseconds) only when something else
// changed, after a restore or the first time. Options an earlier restore
// or dump was given go: with leave-stopped, a dump would leave the processes stopped instead of
// ending them. On a cgroup v1 host whose hierarchies form a yard, the dump opens them there
// instead of mounting each (cgroupYardOption): restores are configured apart and keep their
// own. A CRIU that has LeaveFrozen gets it (Checkpoint, freezeFor). It first waits
// for init to exec the user's program (waitUserExec): a leave-running dump would otherwise freeze
// an init that still runs the shim's binary, which CRIU cannot dump.
func (c *Container) PrepareDump(dir string, options ...string) error {
	c.waitUserExec(execWaitLimit)
	cfg := c.lc.Config()
	changed, err := nameNetNS(&cfg, c.InitPid())
	if err != nil {
		return err
	}
	if yard := cgroupYardOption(c.InitPid()); yard != "" {
		options = append(slices.Clip(options), yard)
	}
	if CRIULeavesFrozen() {
		options = append(slices.Clip(options), LeaveFrozen)
	}
	if len(options) > 0 {
		before := cfg.Labels
		if err := WithCRIUOptions(&cfg, dir, options...); err != nil {
			return err
		}
		changed = changed || !slices.Equal(before, cfg.Labels)
	} else if resetCRIUOptions(&cfg) {
		changed = true
	}
	if !changed {
		return nil
	}
	return wrap("configure the dump", c.lc.Set(cfg))
}

// resetCRIUOptions gives cfg its own CRIU configuration back, reporting whether it had another.
func resetCRIUOptions(cfg *configs.Config) bool {
	if _, ours := utils.SearchLabels(cfg.Labels, originalCRIUConfigLabel); !ours {
		return false
	}
	labels, original := ownCRIUConfig(cfg.Labels)
	if file, named := strings.CutPrefix(original, "named:"); named {
		labels = append(labels, criuConfigLabel+"="+file)
	}
	cfg.Labels = labels
	return true
}

// PauseStopped freezes a container restored with LeaveStopped and continues its
// stopped tasks: they wake up inside the freezer and run only when the container is resumed.
func (c *Container) PauseStopped() error {
	if err := c.Pause(); err != nil {
		return err
	}
	pids, err := c.Pids()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGCONT); err != nil && err != unix.ESRCH {
			return fmt.Errorf("continue restored task %d: %w", pid, err)
		}
	}
	return nil
}
