package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/cklite/cklite/integration/harness/hostcheck"
	"github.com/cklite/cklite/pkg/config"
	"github.com/cklite/cklite/pkg/fault"
	"github.com/cklite/cklite/pkg/localimage"
	"github.com/cklite/cklite/pkg/paths"
)

// DefaultBaseDir holds one directory per running harness daemon. It is on disk, not tmpfs: the
// daemon's overlay upper directories live there and tests write hundreds of megabytes into them.
const DefaultBaseDir = "/var/lib/cklite-test"

// CkliteRuntime is the runtime type of the cklite shim; containerd resolves it to the binary
// containerd-shim-cklite-v2 on its PATH, which Stack.Path puts first.
const CkliteRuntime = "io.containerd.cklite.v2"

// Config says what daemon to start. The zero value is a stock containerd (runc shim, overlayfs)
// in a fresh directory under DefaultBaseDir.
type Config struct {
	// Dir holds root, state, socket, configs and logs; it is created and removed by the harness.
	// Empty: a new directory under DefaultBaseDir.
	Dir string
	// Address is the gRPC socket; empty: Dir/containerd.sock. An address some other process
	// already serves is an error.
	Address string
	// Registry, when set, is made reachable over plain HTTP for containerd, CRI and nerdctl.
	Registry *Registry
	// CkliteSnapshotter starts cklite-snapshotter from Stack.ProjectBin and registers it as the
	// proxy snapshotter "cklite".
	CkliteSnapshotter bool
	// LogLevel of containerd; empty: "info".
	LogLevel string
	// Namespace is the daemon's namespace; empty: a new one, it-<random>. Daemons that share one
	// also share its cgroups (/<namespace>/<id>): their containers need distinct ids.
	Namespace string
	// StateDir is cklite's state directory (shim.toml's state_dir) for the daemon's shims and
	// CLI runs; empty: Dir/cklite, released with the daemon.
	StateDir string
	// Imports are configuration files containerd imports (what `cklite setup --existing` writes).
	Imports []string
	// FaultFile, when set, is CKLITE_FAULT_FILE for containerd, its shims, the snapshotter and
	// the CLIs (pkg/fault): the fault-injection tests arm faults in it.
	FaultFile string
}

// Daemon is a running private containerd.
type Daemon struct {
	Dir       string
	Root      string
	State     string
	Address   string
	Namespace string
	// SnapshotterAddress is the cklite-snapshotter socket, when it runs.
	SnapshotterAddress string
	// HostsDir holds the hosts.toml files for registries (containerd's config_path).
	HostsDir string
	// StateDir is cklite's state directory (see Config.StateDir).
	StateDir string

	stack       *Stack
	cfg         Config
	ctrd        *proc
	snapshotter *proc
	client      *client.Client
	ownDir      bool
	started     time.Time
}

// Start starts containerd as cfg says and waits until it serves its API.
func Start(ctx context.Context, stack *Stack, cfg Config) (_ *Daemon, retErr error) {
	if err := preflight(); err != nil {
		return nil, err
	}
	// A namespace of its own: the cgroups (/<namespace>/<id>) and runc state of this daemon's
	// containers never collide with another's, and teardown may remove them wholesale.
	d := &Daemon{stack: stack, cfg: cfg, Dir: cfg.Dir, Namespace: cfg.Namespace, started: time.Now()}
	if d.Namespace == "" {
		d.Namespace = "it-" + randomHex(4)
	}
	if d.Dir == "" {
		dir, err := newRunDir("ctrd-")
		if err != nil {
			return nil, err
		}
		d.Dir, d.ownDir = dir, true
	} else if err := os.MkdirAll(d.Dir, 0o755); err != nil {
		return nil, err
	}
	d.Root = filepath.Join(d.Dir, "root")
	d.State = filepath.Join(d.Dir, "state")
	d.HostsDir = filepath.Join(d.Dir, "certs.d")
	d.StateDir = cfg.StateDir
	if d.StateDir == "" {
		d.StateDir = filepath.Join(d.Dir, "cklite")
	}
	d.Address = cfg.Address
	if d.Address == "" {
		d.Address = filepath.Join(d.Dir, "containerd.sock")
	}
	for _, p := range []string{d.Root, d.State, d.HostsDir, filepath.Join(d.Dir, "tmp"), filepath.Join(d.Dir, "cni", "net.d")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, err
		}
	}
	if err := claimSocket(d.Address); err != nil {
		// Nothing started, and tearing down by this address would hit the process serving it.
		if d.ownDir {
			_ = os.RemoveAll(d.Dir)
		}
		return nil, err
	}
	if err := writeOwner(d.Dir, d.Address, d.Namespace); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			_ = d.Close(context.WithoutCancel(ctx))
		}
	}()
	if cfg.Registry != nil {
		if err := cfg.Registry.WriteHostsDir(d.HostsDir); err != nil {
			return nil, err
		}
	}
	if cfg.CkliteSnapshotter {
		if err := d.startSnapshotter(); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(d.shimConfigPath(), []byte(d.shimConfig()), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(d.Dir, "containerd.toml"), []byte(d.containerdConfig()), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(d.nerdctlConfigPath(), []byte(d.nerdctlConfig()), 0o644); err != nil {
		return nil, err
	}
	if err := d.startContainerd(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Daemon) startContainerd(ctx context.Context) error {
	p, err := startProc("containerd", filepath.Join(d.Dir, "containerd.log"), d.env(),
		filepath.Join(d.stack.Bin, "containerd"), "--config", filepath.Join(d.Dir, "containerd.toml"))
	if err != nil {
		return err
	}
	d.ctrd = p
	var c *client.Client
	err = p.waitReady(30*time.Second, func() error {
		if c == nil {
			if c, err = client.New(d.Address, client.WithDefaultNamespace(d.Namespace), client.WithTimeout(time.Second)); err != nil {
				return err
			}
		}
		serving, err := c.IsServing(ctx)
		if err == nil && !serving {
			err = errors.New("containerd is not serving yet")
		}
		return err
	})
	if err != nil {
		if c != nil {
			c.Close()
		}
		return err
	}
	d.client = c
	return nil
}

func (d *Daemon) startSnapshotter() error {
	if !d.stack.Has("cklite-snapshotter") {
		return fmt.Errorf("cklite-snapshotter not built in %s: run 'make build'", d.stack.ProjectBin)
	}
	d.SnapshotterAddress = filepath.Join(d.Dir, "cklite-snapshotter.sock")
	p, err := startProc("cklite-snapshotter", filepath.Join(d.Dir, "cklite-snapshotter.log"), d.env(),
		filepath.Join(d.stack.ProjectBin, "cklite-snapshotter"),
		"--address", d.SnapshotterAddress, "--root", filepath.Join(d.Dir, "cklite-snapshotter"),
		"--containerd-address", d.Address, "--log-level", "debug")
	if err != nil {
		return err
	}
	d.snapshotter = p
	return p.waitReady(10*time.Second, func() error {
		conn, err := net.Dial("unix", d.SnapshotterAddress)
		if err != nil {
			return err
		}
		return conn.Close()
	})
}

// RestartSnapshotter stops cklite-snapshotter — with SIGKILL at once when kill is set, to play a
// crash at whatever it was doing — and starts it again on the same socket and root.
func (d *Daemon) RestartSnapshotter(kill bool) error {
	if d.snapshotter == nil {
		return fmt.Errorf("cklite-snapshotter is not running: start the daemon with Config{CkliteSnapshotter: true}")
	}
	if kill {
		if err := d.snapshotter.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return err
		}
		<-d.snapshotter.done
	} else if err := d.snapshotter.stop(10 * time.Second); err != nil {
		return err
	}
	return d.startSnapshotter()
}

// StopSnapshotter stops cklite-snapshotter and leaves it stopped (containerd runs on, its proxy
// snapshotter unreachable) until StartSnapshotter.
func (d *Daemon) StopSnapshotter() error {
	if d.snapshotter == nil {
		return fmt.Errorf("cklite-snapshotter is not running: start the daemon with Config{CkliteSnapshotter: true}")
	}
	return d.snapshotter.stop(10 * time.Second)
}

// StartSnapshotter starts cklite-snapshotter again after StopSnapshotter.
func (d *Daemon) StartSnapshotter() error { return d.startSnapshotter() }

// env is the environment of containerd and of the CLIs run against it.
func (d *Daemon) env() []string {
	env := []string{
		"PATH=" + d.stack.Path(),
		"TMPDIR=" + filepath.Join(d.Dir, "tmp"),
		"HOME=" + d.Dir,
		"NERDCTL_TOML=" + d.nerdctlConfigPath(),
		// The shims inherit it from containerd, the CLI reads it too.
		config.ShimConfigEnv + "=" + d.shimConfigPath(),
	}
	if d.cfg.FaultFile != "" {
		env = append(env, fault.FileEnv+"="+d.cfg.FaultFile)
	}
	return env
}

// Instance is cklite's state directory of this containerd instance (pkg/paths): where the
// shims and the CLI keep its checkpoints' image directories and its checkpoint image cache.
func (d *Daemon) Instance(ctx context.Context) (paths.Instance, error) {
	return paths.ForContainerd(ctx, d.StateDir, d.client.IntrospectionService())
}

// Client is a containerd Go client connected to the daemon, defaulting to its namespace.
func (d *Daemon) Client() *client.Client { return d.client }

// Context returns ctx in the daemon's namespace, for Go client calls.
func (d *Daemon) Context(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, d.Namespace)
}

// Ctr runs ctr against the daemon in its namespace and returns its standard output.
func (d *Daemon) Ctr(ctx context.Context, args ...string) (string, error) {
	return d.run(ctx, "ctr", append([]string{"--address", d.Address, "--namespace", d.Namespace}, args...)...)
}

// Nerdctl runs nerdctl against the daemon (address, namespace, data root, CNI and registry hosts
// come from the daemon's nerdctl.toml) and returns its standard output.
func (d *Daemon) Nerdctl(ctx context.Context, args ...string) (string, error) {
	return d.run(ctx, "nerdctl", args...)
}

// Cklite runs the project's cklite CLI against the daemon in its namespace and returns its
// standard output.
func (d *Daemon) Cklite(ctx context.Context, args ...string) (string, error) {
	return d.cklite(ctx, d.Namespace, args...)
}

func (d *Daemon) cklite(ctx context.Context, namespace string, args ...string) (string, error) {
	if !d.stack.Has("cklite") {
		return "", fmt.Errorf("cklite not built in %s: run 'make build'", d.stack.ProjectBin)
	}
	return d.run(ctx, "cklite", append([]string{"--address", d.Address, "-n", namespace}, args...)...)
}

// ProjectBinary is the path of cklite's binary name (bin/name of this checkout).
func (d *Daemon) ProjectBinary(name string) string {
	return filepath.Join(d.stack.ProjectBin, name)
}

// Command returns an unstarted command for the stack's binary name in the daemon's environment,
// for callers that need its stdin, a terminal or a stream.
func (d *Daemon) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	bin := filepath.Join(d.stack.Bin, name)
	if d.stack.Has(name) {
		bin = filepath.Join(d.stack.ProjectBin, name)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = d.env()
	cmd.Dir = d.Dir
	return cmd
}

func (d *Daemon) run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := d.Command(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Import loads a locally built image into the daemon's namespace with `ctr images import`.
func (d *Daemon) Import(ctx context.Context, img localimage.Image) error {
	_, err := d.Ctr(ctx, "images", "import", "--no-unpack", img.Archive)
	return err
}

// Restart stops containerd and starts it again on the same root, state and socket; shims and
// their containers keep running, as they do across a real containerd restart.
func (d *Daemon) Restart(ctx context.Context) error {
	d.client.Close()
	d.client = nil
	if err := d.ctrd.stop(10 * time.Second); err != nil {
		return err
	}
	return d.startContainerd(ctx)
}

// Crash kills containerd with SIGKILL, as a crash would, and starts it again on the same root,
// state and socket. Clients and services taken from Client before are closed.
func (d *Daemon) Crash(ctx context.Context) error {
	d.client.Close()
	d.client = nil
	if err := d.ctrd.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-d.ctrd.done
	return d.startContainerd(ctx)
}

// SnapshotterExited reports whether cklite-snapshotter has exited since it was started (a fault
// killed it), waiting up to wait for its exit to be seen; the caller restarts it with
// StartSnapshotter.
func (d *Daemon) SnapshotterExited(wait time.Duration) bool {
	if d.snapshotter == nil {
		return false
	}
	select {
	case <-d.snapshotter.done:
		return true
	case <-time.After(wait):
		return false
	}
}

// LogTail returns the last n lines of containerd's log, for test failure messages.
func (d *Daemon) LogTail(n int) string {
	if d.ctrd == nil {
		return ""
	}
	return d.ctrd.logTail(n)
}

// Close removes every container and task, stops containerd and the snapshotter, then makes sure
// nothing is left: shims, container processes, cgroups, mounts, and the daemon's directory.
func (d *Daemon) Close(ctx context.Context) error {
	var errs []error
	if d.client != nil {
		errs = append(errs, removeAll(ctx, d.client, d.started))
		d.client.Close()
	}
	if d.ctrd != nil {
		errs = append(errs, d.ctrd.stop(10*time.Second))
	}
	if d.snapshotter != nil {
		errs = append(errs, d.snapshotter.stop(10*time.Second))
	}
	errs = append(errs, teardown(d.Dir, d.Address, d.Namespace))
	if d.ownDir {
		errs = append(errs, os.RemoveAll(d.Dir))
	}
	return errors.Join(errs...)
}

// claimSocket fails when another process serves address, and removes a stale socket file.
func claimSocket(address string) error {
	if _, err := os.Stat(address); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	conn, err := net.DialTimeout("unix", address, time.Second)
	if err == nil {
		conn.Close()
		return fmt.Errorf("socket %s is already served by another process (a containerd still running?)", address)
	}
	return os.Remove(address)
}

func preflight() error {
	if err := hostcheck.Root(); err != nil {
		return fmt.Errorf("the integration harness starts containerd and mounts overlays: %w", err)
	}
	return hostcheck.Overlay()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// FIFODir is where `ctr run --fifo-dir` should put a task's stdio FIFOs: ctr leaves them behind
// for detached tasks, and under the daemon's directory they go away with it.
func (d *Daemon) FIFODir() string { return filepath.Join(d.Dir, "fifo") }

// RootfsPath is where the shim mounts container id's root filesystem (<bundle>/rootfs), visible
// from the host: tests read and write a container's files there, even while it is paused.
func (d *Daemon) RootfsPath(id string) string { return d.rootfsPath(d.Namespace, id) }

func (d *Daemon) rootfsPath(namespace, id string) string {
	return filepath.Join(d.State, "io.containerd.runtime.v2.task", namespace, id, "rootfs")
}
