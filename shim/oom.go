package shim

import (
	"context"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/log"
)

// watchOOM publishes TaskOOM for every OOM kill in the container's cgroup. libcontainer's
// notifier channel closes when the cgroup goes away, so a restored container is watched anew.
func (s *service) watchOOM(ctx context.Context, c *container) {
	ch, err := c.engine().OOM()
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", c.id).Warn("watch OOM events")
		return
	}
	go func() {
		for range ch {
			s.events.send(&eventstypes.TaskOOM{ContainerID: c.id})
		}
	}()
}
