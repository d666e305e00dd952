package shim

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/log"
)

// workLease holds everything a checkpoint creates in containerd (the capture's snapshot, the
// frozen layer) until the checkpoint's own lease holds it: containerd's collector never sees the
// frozen layer unreferenced in between. Neither its creation nor its deletion is on the
// checkpoint's critical path: it is created while the first steps run (the container's record,
// the dump's preparation, the freeze and the dump itself), and deleted once the checkpoint is
// answered. It expires by itself should the shim die first, taking with it what only it held (a
// capture never recorded).
type workLease struct {
	lm   leases.Manager
	done chan struct{}
	l    leases.Lease
	err  error
}

// workLeaseTTL bounds how long a work lease outlives a shim that died holding it.
const workLeaseTTL = 10 * time.Minute

func startWorkLease(ctx context.Context, lm leases.Manager) *workLease {
	w := &workLease{lm: lm, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.l, w.err = lm.Create(ctx, leases.WithRandomID(), leases.WithExpiration(workLeaseTTL))
	}()
	return w
}

// under returns ctx under the lease, once it is created.
func (w *workLease) under(ctx context.Context) (context.Context, error) {
	<-w.done
	if w.err != nil {
		return nil, fmt.Errorf("lease for the checkpoint: %w", w.err)
	}
	return leases.WithLease(ctx, w.l.ID), nil
}

// end deletes the lease once it is created. After a checkpoint that was taken it does so in the
// background: by then the checkpoint's own lease holds what the checkpoint keeps. After one that
// failed it does so before the answer, which must find containerd as it was before the call.
func (w *workLease) end(ctx context.Context, taken bool) {
	ctx = context.WithoutCancel(ctx)
	if taken {
		go w.delete(ctx)
		return
	}
	w.delete(ctx)
}

func (w *workLease) delete(ctx context.Context) {
	<-w.done
	if w.err != nil {
		return
	}
	if err := w.lm.Delete(ctx, w.l); err != nil {
		log.G(ctx).WithError(err).WithField("lease", w.l.ID).Warn("delete the checkpoint's work lease: it expires by itself")
	}
}
