package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

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

// LeaveStoppedOnRestore makes a restore through cfg leave the restored tasks stopped (SIGSTOP)
// instead of running, so that PauseStopped can freeze them before they execute an instruction.
// libcontainer has no option for CRIU's leave-stopped, but passes CRIU a configuration file: a
// copy of the one it would use, plus leave-stopped, is written into dir.
//
// Freezing the cgroup from CRIU instead (its "full" cgroup mode restores a frozen freezer.state)
// deadlocks: libcontainer puts CRIU itself into the container's cgroups for the restore.
func LeaveStoppedOnRestore(cfg *configs.Config, dir string) error {
	var base []byte
	file, named := utils.SearchLabels(cfg.Labels, criuConfigLabel)
	if !named {
		file = defaultCRIUConfig
	}
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil && (named || !os.IsNotExist(err)) {
			return fmt.Errorf("read CRIU configuration %s: %w", file, err)
		}
		base = data
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("CRIU work directory: %w", err)
	}
	conf := filepath.Join(dir, "criu-leave-stopped.conf")
	data := append(base, "\nleave-stopped\n"...)
	if err := os.WriteFile(conf, data, 0o600); err != nil {
		return fmt.Errorf("write CRIU configuration: %w", err)
	}
	cfg.Labels = withoutLabel(cfg.Labels, criuConfigLabel)
	cfg.Labels = append(cfg.Labels, criuConfigLabel+"="+conf)
	if named {
		cfg.Labels = append(cfg.Labels, originalCRIUConfigLabel+"="+file)
	}
	return nil
}

// originalCRIUConfigLabel keeps the spec's CRIU configuration while LeaveStoppedOnRestore's
// stands in for it.
const originalCRIUConfigLabel = "cklite.criu-config"

func withoutLabel(labels []string, key string) []string {
	out := make([]string, 0, len(labels))
	for _, l := range labels {
		if !strings.HasPrefix(l, key+"=") {
			out = append(out, l)
		}
	}
	return out
}

// forgetLeaveStopped gives the container its own CRIU configuration back after the restore
// LeaveStoppedOnRestore prepared: with leave-stopped, a later dump would leave the processes
// stopped instead of ending them.
func (c *Container) forgetLeaveStopped() error {
	cfg := c.lc.Config()
	original, named := utils.SearchLabels(cfg.Labels, originalCRIUConfigLabel)
	cfg.Labels = withoutLabel(withoutLabel(cfg.Labels, criuConfigLabel), originalCRIUConfigLabel)
	if named {
		cfg.Labels = append(cfg.Labels, criuConfigLabel+"="+original)
	}
	return wrap("restore the CRIU configuration", c.lc.Set(cfg))
}

// PauseStopped freezes a container restored with LeaveStoppedOnRestore and continues its
// stopped tasks: they wake up inside the freezer and run only when the container is resumed.
func (c *Container) PauseStopped() error {
	if err := c.forgetLeaveStopped(); err != nil {
		return err
	}
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
