package setup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/cklite/cklite/pkg/config"
)

// Binaries are the programs an instance runs, as absolute paths.
type Binaries struct {
	Containerd  string
	Snapshotter string // cklite-snapshotter
	Shim        string // containerd-shim-cklite-v2, which containerd finds on its PATH
}

// The daemons' names: of their pid files and logs.
const (
	containerdName  = "containerd"
	snapshotterName = "cklite-snapshotter"
)

// readyTimeout bounds how long a daemon may take to serve its socket.
const readyTimeout = 30 * time.Second

// Private reports whether the instance at root has a containerd of its own (the others add
// cklite to a containerd that runs already).
func Private(root string) bool {
	_, err := os.Stat(Layout{root}.ContainerdConfig())
	return err == nil
}

// Start starts the instance's daemons in the background: cklite-snapshotter, then containerd
// when the instance has its own. Each runs in a session of its own, logs to ROOT/log and has its
// pid in ROOT/run; Start returns once each serves its socket. A daemon already running from this
// root is left alone; a socket some other process serves is refused, as containerd would
// otherwise take its path over.
func Start(ctx context.Context, root string, bins Binaries, progress io.Writer) error {
	l := Layout{root}
	snap, err := loadSnapshotter(l)
	if err != nil {
		return err
	}
	private := Private(root)
	env := environment(l, bins, private)
	err = startDaemon(ctx, l, snapshotterName, snap.Address, env, progress, func(context.Context) error {
		return dial(snap.Address)
	}, bins.Snapshotter, "--config", l.SnapshotterConfig())
	if err != nil || !private {
		return err
	}
	return startDaemon(ctx, l, containerdName, snap.ContainerdAddress, env, progress, func(ctx context.Context) error {
		return serving(ctx, snap.ContainerdAddress)
	}, bins.Containerd, "--config", l.ContainerdConfig())
}

// loadSnapshotter reads the instance's snapshotter configuration: its socket, and containerd's.
func loadSnapshotter(l Layout) (config.Snapshotter, error) {
	snap, err := config.LoadSnapshotter(l.SnapshotterConfig())
	if err != nil {
		return snap, fmt.Errorf("%w (is %s a root that cklite setup wrote?)", err, l.Root)
	}
	return snap, nil
}

// ContainerdAddress is the socket of the instance's containerd.
func ContainerdAddress(root string) (string, error) {
	snap, err := loadSnapshotter(Layout{root})
	return snap.ContainerdAddress, err
}

// environment is the daemons' environment: the caller's, with the shim's and containerd's
// directories first on PATH (containerd runs the shim it finds there; the shim finds criu there,
// where make deps puts it beside containerd) and, for a private containerd, the shim's
// configuration, which its shims inherit.
func environment(l Layout, bins Binaries, private bool) []string {
	var dirs []string
	for _, b := range []string{bins.Shim, bins.Containerd} {
		if d := filepath.Dir(b); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, config.ShimConfigEnv+"=")
	})
	env = append(env, "PATH="+strings.Join(append(dirs, os.Getenv("PATH")), ":"))
	if private {
		env = append(env, config.ShimConfigEnv+"="+l.ShimConfig(), "TMPDIR="+l.Temp())
	}
	return env
}

// startDaemon starts argv as daemon name serving socket, unless it runs already, and waits until
// ready says it serves.
func startDaemon(ctx context.Context, l Layout, name, socket string, env []string, progress io.Writer, ready func(context.Context) error, argv ...string) error {
	if p, err := readPIDFile(l.PIDFile(name)); err == nil && p.alive() {
		fmt.Fprintf(progress, "%s is running already (pid %d)\n", name, p.pid)
		return nil
	}
	if dial(socket) == nil {
		return fmt.Errorf("%s: socket %s is served by a process this root did not start: stop it, or choose another address", name, socket)
	}
	logPath := l.Log(name)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = env, "/"
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: the caller's terminal and its signals are not the daemon's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	p, err := recordPID(l.PIDFile(name), cmd.Process.Pid)
	if err == nil {
		err = waitReady(ctx, name, exited, ready)
	}
	if err != nil {
		// Nothing half-started stays behind.
		_ = cmd.Process.Kill()
		<-exited
		_ = os.Remove(l.PIDFile(name))
		return fmt.Errorf("%w\nlast lines of %s:\n%s", err, logPath, tail(logPath, 15))
	}
	fmt.Fprintf(progress, "%s started (pid %d), serving %s, log %s\n", name, p.pid, socket, logPath)
	return nil
}

// waitReady polls ready until it succeeds, the daemon exits, ctx ends or readyTimeout passes.
func waitReady(ctx context.Context, name string, exited <-chan error, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case werr := <-exited:
			return fmt.Errorf("%s exited at start (%v)", name, werr)
		case <-ctx.Done():
			return fmt.Errorf("%s did not serve within %s: %w", name, readyTimeout, err)
		case <-tick.C:
		}
	}
}

func dial(socket string) error {
	conn, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return err
	}
	return conn.Close()
}

// serving reports whether containerd at address answers its API.
func serving(ctx context.Context, address string) error {
	if err := dial(address); err != nil {
		return err
	}
	c, err := client.New(address, client.WithTimeout(time.Second))
	if err != nil {
		return err
	}
	defer c.Close()
	ok, err := c.IsServing(ctx)
	if err == nil && !ok {
		err = errors.New("containerd is not serving yet")
	}
	return err
}

// Stop stops the daemons Start started, containerd first, each with SIGTERM and, after timeout,
// SIGKILL, and removes the instance's bridge once no container is on it. The shims and
// containers of a stopped containerd keep running, as across any containerd restart: callers
// remove them first (RunningTasks).
func Stop(root string, timeout time.Duration, progress io.Writer) error {
	l := Layout{root}
	if _, err := loadSnapshotter(l); err != nil {
		return err
	}
	var errs []error
	for _, name := range []string{containerdName, snapshotterName} {
		errs = append(errs, stopDaemon(l, name, timeout, progress))
	}
	if Private(root) {
		errs = append(errs, RemoveBridge(root, false))
	}
	return errors.Join(errs...)
}

func stopDaemon(l Layout, name string, timeout time.Duration, progress io.Writer) error {
	pidFile := l.PIDFile(name)
	p, err := readPIDFile(pidFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := p.terminate(timeout); err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	fmt.Fprintf(progress, "%s stopped (pid %d)\n", name, p.pid)
	return os.Remove(pidFile)
}

// RunningTasks lists the tasks of the containerd at address in every namespace, as
// NAMESPACE/ID: what stopping it would leave running without a containerd.
func RunningTasks(ctx context.Context, address string) ([]string, error) {
	if dial(address) != nil {
		return nil, nil // not serving: nothing to ask
	}
	c, err := client.New(address, client.WithTimeout(5*time.Second))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	nss, err := c.NamespaceService().List(ctx)
	if err != nil {
		return nil, err
	}
	var running []string
	for _, ns := range nss {
		resp, err := c.TaskService().List(namespaces.WithNamespace(ctx, ns), &tasks.ListTasksRequest{})
		if err != nil {
			return nil, err
		}
		for _, t := range resp.Tasks {
			running = append(running, ns+"/"+t.ID)
		}
	}
	return running, nil
}

// tail is the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
