package shim

import (
	"context"

	"github.com/cklite/cklite/runtime"
)

// beginRestore returns the context and bounds of a restore into c: shim.toml's restore limits
// (the configuration read at shim start),
// and a context that a Kill or Delete of the task ends (cancelRestore), so that nothing waits on
// a restore that cannot finish. end must be called when the restore returns.
func (c *container) beginRestore(ctx context.Context, sc shimConfig) (_ context.Context, _ runtime.RestoreLimits, end func(), _ error) {
	cfg, err := sc.get()
	if err != nil {
		return nil, runtime.RestoreLimits{}, nil, err
	}
	timeout, logBytes, err := cfg.RestoreLimits()
	if err != nil {
		return nil, runtime.RestoreLimits{}, nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	c.mu.Lock()
	c.restoreCancel = cancel
	c.mu.Unlock()
	end = func() {
		c.mu.Lock()
		c.restoreCancel = nil
		c.mu.Unlock()
		cancel(nil)
	}
	return ctx, runtime.RestoreLimits{Timeout: timeout, LogLimit: logBytes}, end, nil
}

// cancelRestore ends a restore into c that is under way, giving why; it reports whether there was one.
func (c *container) cancelRestore(why error) bool {
	c.mu.Lock()
	cancel := c.restoreCancel
	c.mu.Unlock()
	if cancel == nil {
		return false
	}
	cancel(why)
	return true
}
