package runtime

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/selinux/go-selinux"
	"golang.org/x/sys/unix"
)

// NewProcess converts an OCI process into a libcontainer process (a port of runc's newProcess,
// which lives in runc's package main). Stdio, console and Init are left to the caller.
func NewProcess(p *specs.Process) (*libcontainer.Process, error) {
	if err := validateProcess(p); err != nil {
		return nil, fmt.Errorf("invalid process: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	lp := &libcontainer.Process{
		Args:            p.Args,
		Env:             p.Env,
		UID:             int(p.User.UID),
		GID:             int(p.User.GID),
		Cwd:             p.Cwd,
		Label:           p.SelinuxLabel,
		NoNewPrivileges: &p.NoNewPrivileges,
		AppArmorProfile: p.ApparmorProfile,
		Scheduler:       p.Scheduler,
		IOPriority:      p.IOPriority,
	}
	if p.ConsoleSize != nil {
		lp.ConsoleWidth = uint16(p.ConsoleSize.Width)
		lp.ConsoleHeight = uint16(p.ConsoleSize.Height)
	}
	if c := p.Capabilities; c != nil {
		lp.Capabilities = &configs.Capabilities{
			Bounding:    c.Bounding,
			Effective:   c.Effective,
			Inheritable: c.Inheritable,
			Permitted:   c.Permitted,
			Ambient:     c.Ambient,
		}
	}
	for _, g := range p.User.AdditionalGids {
		lp.AdditionalGroups = append(lp.AdditionalGroups, int(g))
	}
	for _, r := range p.Rlimits {
		rl, err := rlimit(r)
		if err != nil {
			return nil, err
		}
		lp.Rlimits = append(lp.Rlimits, rl)
	}
	aff, err := configs.ConvertCPUAffinity(p.ExecCPUAffinity)
	if err != nil {
		return nil, fmt.Errorf("exec CPU affinity: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	lp.CPUAffinity = aff
	return lp, nil
}

// validateProcess is runc's validateProcessSpec (package main), naming the offending value.
func validateProcess(p *specs.Process) error {
	switch {
	case p == nil:
		return errors.New("process property must not be empty")
	case p.Cwd == "":
		return errors.New("cwd property must not be empty")
	case !filepath.IsAbs(p.Cwd):
		return fmt.Errorf("cwd %q must be an absolute path", p.Cwd)
	case len(p.Args) == 0:
		return errors.New("args must not be empty")
	case p.SelinuxLabel != "" && !selinux.GetEnabled():
		return errors.New("selinux label is specified in config, but selinux is disabled or not supported")
	}
	return nil
}

var rlimits = map[string]int{
	"RLIMIT_CPU":        unix.RLIMIT_CPU,
	"RLIMIT_FSIZE":      unix.RLIMIT_FSIZE,
	"RLIMIT_DATA":       unix.RLIMIT_DATA,
	"RLIMIT_STACK":      unix.RLIMIT_STACK,
	"RLIMIT_CORE":       unix.RLIMIT_CORE,
	"RLIMIT_RSS":        unix.RLIMIT_RSS,
	"RLIMIT_NPROC":      unix.RLIMIT_NPROC,
	"RLIMIT_NOFILE":     unix.RLIMIT_NOFILE,
	"RLIMIT_MEMLOCK":    unix.RLIMIT_MEMLOCK,
	"RLIMIT_AS":         unix.RLIMIT_AS,
	"RLIMIT_LOCKS":      unix.RLIMIT_LOCKS,
	"RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_MSGQUEUE":   unix.RLIMIT_MSGQUEUE,
	"RLIMIT_NICE":       unix.RLIMIT_NICE,
	"RLIMIT_RTPRIO":     unix.RLIMIT_RTPRIO,
	"RLIMIT_RTTIME":     unix.RLIMIT_RTTIME,
}

func rlimit(r specs.POSIXRlimit) (configs.Rlimit, error) {
	t, ok := rlimits[r.Type]
	if !ok {
		return configs.Rlimit{}, fmt.Errorf("unknown rlimit %q: %w", r.Type, errdefs.ErrInvalidArgument)
	}
	return configs.Rlimit{Type: t, Hard: r.Hard, Soft: r.Soft}, nil
}
