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
	labels := make([]string, 0, len(cfg.Labels)+1)
	for _, l := range cfg.Labels {
		if !strings.HasPrefix(l, criuConfigLabel+"=") {
			labels = append(labels, l)
		}
	}
	cfg.Labels = append(labels, criuConfigLabel+"="+conf)
	return nil
}

// PauseStopped freezes a container restored with LeaveStoppedOnRestore and continues its
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
