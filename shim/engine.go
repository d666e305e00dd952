package shim

import (
	"context"
	"github.com/opencontainers/cgroups"
	"syscall"

	"github.com/opencontainers/runc/libcontainer"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/runtime"
)

// engine is what the shim asks of a container's engine, runtime.Container (libcontainer and
// CRIU): the seam where unit tests put a fake.
type engine interface {
	Start(p *libcontainer.Process) error
	Release() error
	Exec(p *libcontainer.Process) error
	ExecInTree(p *libcontainer.Process) (*runtime.TreeProcess, error)
	Restore(ctx context.Context, p *libcontainer.Process, o runtime.CheckpointOpts, lim runtime.RestoreLimits) error
	Signal(sig syscall.Signal, all bool) error
	Pause() error
	Resume() error
	Paused() bool
	PauseStopped() error
	Pids() ([]int, error)
	Update(r specs.LinuxResources) error
	Resources() *cgroups.Resources
	OOM() (<-chan struct{}, error)
	HasNetNS() bool
	PrepareDump(work string, options ...string) error
	Checkpoint(o runtime.CheckpointOpts) error
	WatchSeized() (*runtime.SeizeWatch, error)
	PrepareNextDump()
	KeepReadyCRIU() *runtime.ReadyCRIU
	AdoptReadyCRIU(kept *runtime.ReadyCRIU)
	Destroy() error
	Vacate() error
	Stdio() ([]string, error)
}

var _ engine = (*runtime.Container)(nil)

// engine is the container's engine now. An in-place checkpoint or rollback replaces it (the
// restored processes live in a new libcontainer container); c.mu guards the swap, and the
// lifecycle lock (see doc.go) keeps every call that acts on it out while one is under way.
func (c *container) engine() engine {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.eng
}

func (c *container) setEngine(e engine) {
	c.mu.Lock()
	c.eng = e
	c.mu.Unlock()
}
