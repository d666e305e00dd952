package shim

import (
	"context"
	"fmt"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"

	"github.com/cklite/cklite/runtime"
)

// Stats returns the container's cgroup metrics (cgroup1 or cgroup2 stats.Metrics).
func (s *service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	cg, err := c.statsCgroup()
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	m, err := cg.Metrics()
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return &taskAPI.StatsResponse{Stats: typeurl.MarshalProto(m)}, nil
}

// statsCgroup is the cgroup Stats reads: the one loaded when the init started or, if that load
// failed, loaded now. A failed load at Create was kept for the container's life, and every Stats
// answered NotFound, which containerd's metrics turn into no metrics at all: the CRI's
// ContainerStats then failed with "unexpected metrics response: []" (seen under load, with
// "cgroup mountpoint does not exist" logged at Create).
func (c *container) statsCgroup() (*runtime.Cgroup, error) {
	c.mu.Lock()
	cg := c.cgroup
	c.mu.Unlock()
	if cg != nil {
		return cg, nil
	}
	if c.init.getPid() == 0 {
		return nil, fmt.Errorf("container %s has no process yet, so no cgroup: %w", c.id, errdefs.ErrNotFound)
	}
	return c.loadCgroup()
}

// loadCgroup loads the cgroup of the container's init for Stats and keeps it.
func (c *container) loadCgroup() (*runtime.Cgroup, error) {
	cg, err := c.cgroupOf(c.init.getPid())
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.cgroup = cg
	c.mu.Unlock()
	return cg, nil
}
