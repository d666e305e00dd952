package runtime

import (
	"fmt"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	cgroupsv2 "github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/typeurl/v2"
)

// Cgroup is a process's cgroup as containerd's cgroups package sees it, for metrics in the same
// types containerd-shim-runc-v2 reports (cgroup1 stats.Metrics or cgroup2 stats.Metrics).
type Cgroup struct {
	v1 cgroup1.Cgroup
	v2 *cgroupsv2.Manager
}

// LoadCgroup loads the cgroup of pid (the container's init).
func LoadCgroup(pid int) (*Cgroup, error) {
	if cgroups.Mode() == cgroups.Unified {
		path, err := cgroupsv2.PidGroupPath(pid)
		if err != nil {
			return nil, fmt.Errorf("cgroup2 path of %d: %w", pid, err)
		}
		m, err := cgroupsv2.Load(path)
		if err != nil {
			return nil, fmt.Errorf("load cgroup2 %s: %w", path, err)
		}
		return &Cgroup{v2: m}, nil
	}
	cg, err := cgroup1.Load(cgroup1.PidPath(pid))
	if err != nil {
		return nil, fmt.Errorf("load cgroup of %d: %w", pid, err)
	}
	return &Cgroup{v1: cg}, nil
}

// Metrics returns the cgroup's statistics marshalled as an Any.
func (c *Cgroup) Metrics() (typeurl.Any, error) {
	var (
		stats any
		err   error
	)
	if c.v2 != nil {
		stats, err = c.v2.Stat()
	} else {
		stats, err = c.v1.Stat(cgroup1.IgnoreNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup stats: %w", err)
	}
	return typeurl.MarshalAny(stats)
}
