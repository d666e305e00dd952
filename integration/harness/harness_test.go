package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cklite/cklite/pkg/localimage"
)

// These tests start real daemons: they need root and the stack `make deps` installs.

func loadStack(t *testing.T) *Stack {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("harness tests start containerd and need root: run 'sudo make test'")
	}
	s, err := LoadStack()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sleeper is the container runBusybox started: its init, named by pid and start time (the kernel
// reuses pids), so that what the test checks is its own process and nothing else on the machine.
type sleeper struct {
	id    string
	pid   int
	start string
}

// runBusybox starts a daemon running one detached busybox container.
func runBusybox(t *testing.T, s *Stack) (*Daemon, sleeper) {
	t.Helper()
	ctx := context.Background()
	img, err := localimage.Busybox(ctx, localimage.CacheDir(), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Start(ctx, s, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Import(ctx, img); err != nil {
		t.Fatal(err)
	}
	const id = "sleeper"
	if _, err := d.Ctr(ctx, "run", "-d", "--fifo-dir", d.FIFODir(), img.Name, id, "sleep", "1000"); err != nil {
		t.Fatal(err)
	}
	if len(shimsOf(d.Address)) != 1 {
		t.Fatalf("want one shim serving %s, found %v", d.Address, shimsOf(d.Address))
	}
	sl := sleeper{id: id}
	ctr, err := d.Client().LoadContainer(d.Context(ctx), id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := ctr.Task(d.Context(ctx), nil)
	if err != nil {
		t.Fatal(err)
	}
	sl.pid = int(task.Pid())
	if sl.start, err = procStartTime(sl.pid); err != nil {
		t.Fatalf("container %s's init %d: %v", id, sl.pid, err)
	}
	return d, sl
}

// assertGone checks that nothing of daemon d is left on the machine.
func assertGone(t *testing.T, d *Daemon, sl sleeper) {
	t.Helper()
	if _, err := os.Stat(d.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s still there (stat: %v)", d.Dir, err)
	}
	if shims := shimsOf(d.Address); len(shims) > 0 {
		t.Errorf("shims still running: %v", shims)
	}
	for _, mp := range mountPoints() {
		if strings.HasPrefix(mp, d.Dir) {
			t.Errorf("mount left: %s", mp)
		}
	}
	for _, mnt := range cgroupMounts() {
		if _, err := os.Stat(filepath.Join(mnt, d.Namespace)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s still there (stat: %v)", filepath.Join(mnt, d.Namespace), err)
		}
	}
	if _, err := os.Stat(filepath.Join(runcRoot, d.Namespace)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("runc state %s still there", filepath.Join(runcRoot, d.Namespace))
	}
	// Only this daemon's container: another containerd on the machine may well run a sleep too.
	if st, err := statFields(sl.pid); err == nil && st[19] == sl.start && st[0] != "Z" {
		t.Errorf("container %s's process %d (%v) still running", sl.id, sl.pid, cmdline(sl.pid))
	}
}

func TestCloseLeavesNothing(t *testing.T) {
	d, sl := runBusybox(t, loadStack(t))
	if err := d.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	assertGone(t, d, sl)
}

// TestSweepAfterKilledRun leaves a daemon as a killed test run would (containerd gone, its shim,
// container, cgroups and mounts still there, its owner dead) and checks the next run's sweep
// removes all of it.
func TestSweepAfterKilledRun(t *testing.T) {
	d, sl := runBusybox(t, loadStack(t))
	if err := d.ctrd.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.ctrd.done
	d.client.Close()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	owner := fmt.Sprintf("%d 1\n%s\n%s\n", dead.Process.Pid, d.Address, d.Namespace)
	if err := os.WriteFile(filepath.Join(d.Dir, ownerFile), []byte(owner), 0o644); err != nil {
		t.Fatal(err)
	}
	if len(shimsOf(d.Address)) != 1 {
		t.Fatal("the shim should outlive containerd")
	}
	sweepStale(DefaultBaseDir)
	assertGone(t, d, sl)
}

func TestSocketTaken(t *testing.T) {
	s := loadStack(t)
	sock := filepath.Join(t.TempDir(), "taken.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	before, _ := os.ReadDir(DefaultBaseDir)
	_, err = Start(context.Background(), s, Config{Address: sock})
	if err == nil || !strings.Contains(err.Error(), "already served by another process") {
		t.Fatalf("Start on a served socket: err = %v", err)
	}
	if after, _ := os.ReadDir(DefaultBaseDir); len(after) > len(before) {
		t.Errorf("the failed Start left a directory in %s: %v", DefaultBaseDir, after)
	}
}

func TestRegistryAddressTaken(t *testing.T) {
	s := loadStack(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = StartRegistry(s, l.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "already in use") {
		t.Fatalf("StartRegistry on a taken address: err = %v", err)
	}
}

// TestConfigRegistersCklite checks the rendered config registers the cklite CRI runtime and the
// cklite proxy snapshotter in a form containerd itself accepts.
func TestConfigRegistersCklite(t *testing.T) {
	s := loadStack(t)
	dir := t.TempDir()
	d := &Daemon{stack: s, Dir: dir, Root: filepath.Join(dir, "root"), State: filepath.Join(dir, "state"),
		Address: filepath.Join(dir, "c.sock"), HostsDir: filepath.Join(dir, "certs.d"),
		SnapshotterAddress: filepath.Join(dir, "cklite-snapshotter.sock")}
	path := filepath.Join(dir, "containerd.toml")
	if err := os.WriteFile(path, []byte(d.containerdConfig()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(s.Bin, "containerd"), "--config", path, "config", "dump").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd rejects the config: %v\n%s", err, out)
	}
	for _, want := range []string{
		"[proxy_plugins.cklite]",
		"address = '" + d.SnapshotterAddress + "'",
		"runtime_type = '" + CkliteRuntime + "'",
		"snapshotter = 'cklite'",
		"config_path = '" + d.HostsDir + "'",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("containerd's view of the config lacks %q:\n%s", want, out)
		}
	}
}
