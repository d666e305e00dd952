package shim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/paths"
	"github.com/cklite/cklite/runtime"
	"github.com/cklite/cklite/snapshotter/freeze"
)

// fakeEngine records the calls made on it and fails the test when one arrives while a dump, a
// rollback's kill, a restore or a destroy is in progress: the shim must never act on an engine
// being dumped or destroyed. block names the calls that wait, once inside, for release.
type fakeEngine struct {
	t       *testing.T
	name    string
	block   map[string]bool
	entered chan string   // a blocking call has started
	release chan struct{} // lets it go on
	fail    map[string]error
	onKill  func() // the kill's effect: the init's exit

	mu    sync.Mutex
	calls []string
	busy  string // the exclusive call in progress
}

func newFakeEngine(t *testing.T, name string) *fakeEngine {
	return &fakeEngine{t: t, name: name, block: map[string]bool{}, fail: map[string]error{},
		entered: make(chan string, 1), release: make(chan struct{})}
}

// exclusive calls are those nothing may overlap.
var exclusive = []string{"Checkpoint", "Restore", "Destroy", "Vacate", "Kill"}

func (e *fakeEngine) call(name string) error {
	e.mu.Lock()
	if e.busy != "" {
		e.t.Errorf("%s called on engine %s during its %s", name, e.name, e.busy)
	}
	e.calls = append(e.calls, name)
	if slices.Contains(exclusive, name) {
		e.busy = name
	}
	e.mu.Unlock()
	if e.block[name] {
		e.entered <- name
		<-e.release
	}
	e.mu.Lock()
	if e.busy == name {
		e.busy = ""
	}
	e.mu.Unlock()
	return e.fail[name]
}

func (e *fakeEngine) called() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.calls)
}

func (e *fakeEngine) Start(*libcontainer.Process) error { return e.call("Start") }
func (e *fakeEngine) Release() error                    { return e.call("Release") }
func (e *fakeEngine) Exec(*libcontainer.Process) error  { return e.call("Exec") }
func (e *fakeEngine) ExecInTree(*libcontainer.Process) (*runtime.TreeProcess, error) {
	return nil, e.call("ExecInTree")
}
func (e *fakeEngine) Restore(context.Context, *libcontainer.Process, runtime.CheckpointOpts, runtime.RestoreLimits) error {
	return e.call("Restore")
}

// Stdio: no pipe for a checkpoint to hold.
func (e *fakeEngine) Stdio() ([]string, error) {
	return []string{"/dev/null", "/dev/null", "/dev/null"}, e.call("Stdio")
}

func (e *fakeEngine) Signal(sig syscall.Signal, all bool) error {
	if sig != syscall.SIGKILL || !all {
		return e.call(fmt.Sprintf("Signal %d", sig))
	}
	err := e.call("Kill")
	if err == nil && e.onKill != nil {
		e.onKill()
	}
	return err
}
func (e *fakeEngine) Pause() error                              { return e.call("Pause") }
func (e *fakeEngine) Resume() error                             { return e.call("Resume") }
func (e *fakeEngine) PrepareNextDump()                          {}
func (e *fakeEngine) KeepReadyCRIU() *runtime.ReadyCRIU         { return nil }
func (e *fakeEngine) AdoptReadyCRIU(*runtime.ReadyCRIU)         {}
func (e *fakeEngine) Paused() bool                              { _ = e.call("Paused"); return false }
func (e *fakeEngine) PauseStopped() error                       { return e.call("PauseStopped") }
func (e *fakeEngine) Pids() ([]int, error)                      { return nil, e.call("Pids") }
func (e *fakeEngine) Resources() *cgroups.Resources             { return nil }
func (e *fakeEngine) Update(specs.LinuxResources) error         { return e.call("Update") }
func (e *fakeEngine) OOM() (<-chan struct{}, error)             { return nil, e.call("OOM") }
func (e *fakeEngine) HasNetNS() bool                            { _ = e.call("HasNetNS"); return false }
func (e *fakeEngine) PrepareDump(string, ...string) error       { return e.call("PrepareDump") }
func (e *fakeEngine) Checkpoint(o runtime.CheckpointOpts) error { return e.call("Checkpoint") }

// WatchSeized: no freezer cgroup to watch, so a capture runs after the dump.
func (e *fakeEngine) WatchSeized() (*runtime.SeizeWatch, error) {
	return nil, errors.New("no freezer cgroup")
}
func (e *fakeEngine) Destroy() error { return e.call("Destroy") }
func (e *fakeEngine) Vacate() error  { return e.call("Vacate") }

// fakeDaemon is containerd as a checkpoint sees it: the container's rootfs snapshot and labels,
// a snapshotter and a lease manager that accept everything.
type fakeDaemon struct {
	labels   map[string]string
	lineages map[string]checkpoint.Lineage // what setLineage recorded, by container id
	recorded []leases.Lease                // the checkpoints' leases containerd holds
}

func (d *fakeDaemon) dial() (*grpc.ClientConn, error) {
	return nil, errors.New("no containerd in unit tests")
}

func (d *fakeDaemon) containerRootfs(context.Context, string, string) (rootfsSnapshot, error) {
	return rootfsSnapshot{snapshotter: "fake", key: "rootfs", labels: d.labels}, nil
}

func (d *fakeDaemon) setLineage(_ context.Context, _, id string, l checkpoint.Lineage) error {
	if d.lineages == nil {
		d.lineages = map[string]checkpoint.Lineage{}
	}
	d.lineages[id] = l
	return nil
}

func (d *fakeDaemon) snapshotter(string) (snapshots.Snapshotter, error) {
	return fakeSnapshotter{}, nil
}
func (d *fakeDaemon) containers() (freeze.Containers, error) {
	return nil, errors.New("no containerd in unit tests")
}
func (d *fakeDaemon) leases() (leases.Manager, error) { return fakeLeases{recorded: d.recorded}, nil }
func (d *fakeDaemon) instance(context.Context, string) (paths.Instance, error) {
	return paths.Instance{}, errors.New("no containerd in unit tests")
}
func (d *fakeDaemon) close() {}

// fakeSnapshotter has the container's snapshot, mounted nowhere (the unit tests mount nothing).
type fakeSnapshotter struct{ snapshots.Snapshotter }

func (fakeSnapshotter) Mounts(context.Context, string) ([]mount.Mount, error) { return nil, nil }

type fakeLeases struct {
	leases.Manager
	recorded  []leases.Lease
	createErr error // what Create fails with, if anything
}

// List returns the recorded leases a filter names by id (`id==...`), the only lookup the shim
// makes by filter.
func (f fakeLeases) List(_ context.Context, fs ...string) ([]leases.Lease, error) {
	var out []leases.Lease
	for _, l := range f.recorded {
		if slices.ContainsFunc(fs, func(s string) bool { return strings.Contains(s, "id=="+strconv.Quote(l.ID)) }) {
			out = append(out, l)
		}
	}
	return out, nil
}

func (f fakeLeases) Create(_ context.Context, opts ...leases.Opt) (leases.Lease, error) {
	var l leases.Lease
	if f.createErr != nil {
		return l, f.createErr
	}
	for _, o := range opts {
		if err := o(&l); err != nil {
			return l, err
		}
	}
	return l, nil
}
func (fakeLeases) Delete(context.Context, leases.Lease, ...leases.DeleteOpt) error { return nil }
func (fakeLeases) AddResource(context.Context, leases.Lease, leases.Resource) error {
	return nil
}

// nullPublisher drops the events.
type nullPublisher struct{}

func (nullPublisher) Publish(context.Context, string, events.Event) error { return nil }
func (nullPublisher) Close() error                                        { return nil }

// fakeService is a service with one running container on engine e, whose init is pid (a stand-in:
// the fakes signal nothing) and whose exit, when e kills it, is collected as collect would.
func fakeService(t *testing.T, e *fakeEngine, labels map[string]string) (*service, *container) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sctx, sd := shutdown.WithShutdown(ctx)
	t.Cleanup(func() { sd.Shutdown(); cancel() })
	s := &service{
		ctx:        sctx,
		events:     newEventQueue(sctx, nullPublisher{}, sd),
		reaper:     newReaper(),
		shutdown:   sd,
		daemon:     &fakeDaemon{labels: labels},
		admit:      func(dir string, _ *specs.Spec, _ string) error { return checkpoint.CheckImages(dir) },
		containers: map[string]*container{},
	}
	bundle := t.TempDir()
	c := &container{
		id: "c", bundle: bundle, spec: &specs.Spec{},
		execs: map[string]*process{},
		init:  newProcess("c", true, stdio{}),
	}
	c.execsDone = sync.NewCond(&c.mu)
	c.init.spec = &specs.Process{Args: []string{"sleep", "1000"}, Cwd: "/"}
	c.newEngine = func(adjust func(*configs.Config) error) (engine, error) {
		if err := adjust(&configs.Config{}); err != nil {
			return nil, err
		}
		return newFakeEngine(t, "restored"), nil
	}
	c.setEngine(e)
	// A pid no process of this test's has: holdStdio finds no pipe to hold.
	if err := c.init.started(nil, 1<<22-1, statusRunning); err != nil {
		t.Fatal(err)
	}
	e.onKill = func() {
		if !c.init.handOver(137) {
			c.init.setExited(137)
		}
	}
	s.containers[c.id] = c
	return s, c
}
