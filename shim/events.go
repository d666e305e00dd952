package shim

import (
	"context"

	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/log"
)

// eventQueue publishes task events to containerd in order, off the request path.
type eventQueue struct {
	ch       chan any
	shutdown shutdown.Service
}

func newEventQueue(ctx context.Context, publisher shim.Publisher, sd shutdown.Service) *eventQueue {
	q := &eventQueue{ch: make(chan any, 128), shutdown: sd}
	go q.forward(context.WithoutCancel(ctx), publisher)
	return q
}

func (q *eventQueue) send(e any) {
	select {
	case q.ch <- e:
	case <-q.shutdown.Done():
	}
}

// forward publishes until shutdown, then flushes what is queued.
func (q *eventQueue) forward(ctx context.Context, publisher shim.Publisher) {
	defer publisher.Close()
	publish := func(e any) {
		if err := publisher.Publish(ctx, runtime.GetTopic(e), e); err != nil {
			log.G(ctx).WithError(err).Error("post event")
		}
	}
	for {
		select {
		case e := <-q.ch:
			publish(e)
		case <-q.shutdown.Done():
			for {
				select {
				case e := <-q.ch:
					publish(e)
				default:
					return
				}
			}
		}
	}
}
