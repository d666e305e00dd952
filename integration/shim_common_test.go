package integration

// Helpers of the TestShim* tests, which hold cklite's shim to the behaviour of containerd's runc
// shim: every test runs once per runtime, each time on a private containerd of its own.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/shimproc"
	"github.com/cklite/cklite/integration/workload"
)

const runcRuntime = "io.containerd.runc.v2"

// shimRuntimes are the runtimes every TestShim test runs against: the stock runc shim, the
// reference, and cklite's.
var shimRuntimes = []string{runcRuntime, harness.CkliteRuntime}

// forEachRuntime runs fn as the subtest "runtime=NAME" for each of shimRuntimes.
func forEachRuntime(t *testing.T, fn func(t *testing.T, rt string)) {
	t.Helper()
	for _, rt := range shimRuntimes {
		t.Run("runtime="+rt, func(t *testing.T) {
			skipUnbuiltShim(t, rt)
			fn(t, rt)
		})
	}
}

// skipUnbuiltShim skips a cklite subtest while bin/containerd-shim-cklite-v2 does not exist, and
// only then: once the shim is built, a failure is a failure. To be removed when the shim lands.
func skipUnbuiltShim(t *testing.T, rt string) {
	t.Helper()
	const bin = "containerd-shim-cklite-v2"
	if rt == harness.CkliteRuntime && !stack.Has(bin) {
		t.Skipf("%s is not built yet (no %s in %s)", rt, bin, stack.ProjectBin)
	}
}

// shimDaemon starts a private containerd holding the busybox image (as busybox.Name).
func shimDaemon(t *testing.T) *harness.Daemon {
	t.Helper()
	d := startDaemon(t, harness.Config{})
	if err := d.Import(context.Background(), busybox); err != nil {
		t.Fatal(err)
	}
	return d
}

// runDetached is `nerdctl run -d` of busybox with runtime rt (no network unless flags pick one),
// named name; flags go before the image, cmd after it. It returns the container's full id.
func runDetached(t *testing.T, d *harness.Daemon, rt, name string, flags []string, cmd ...string) string {
	t.Helper()
	args := append([]string{"run", "-d", "--runtime", rt, "--name", name}, flags...)
	if !hasNetFlag(flags) {
		args = append(args, "--net", "none")
	}
	args = append(append(args, busybox.Name), cmd...)
	return strings.TrimSpace(mustNerdctl(t, d, args...))
}

func hasNetFlag(flags []string) bool {
	for _, f := range flags {
		if f == "--net" || strings.HasPrefix(f, "--net=") || f == "--network" || strings.HasPrefix(f, "--network=") {
			return true
		}
	}
	return false
}

// result is how a CLI run ended: its output streams and exit code.
type result struct {
	stdout, stderr string
	code           int
}

// cliTimeout bounds each nerdctl run of the shim tests: a shim that hangs fails the subtest
// instead of the whole run.
const cliTimeout = time.Minute

// nerdctlResult runs nerdctl with stdin and returns how it ended; only failing to run it, or a
// timeout, fails the test, so callers can check non-zero exit codes.
func nerdctlResult(t *testing.T, d *harness.Daemon, stdin string, args ...string) result {
	t.Helper()
	return cliResult(t, d, stdin, "nerdctl", args...)
}

// ctrResult is nerdctlResult for ctr, in the daemon's namespace.
func ctrResult(t *testing.T, d *harness.Daemon, stdin string, args ...string) result {
	t.Helper()
	return cliResult(t, d, stdin, "ctr", append([]string{"--address", d.Address, "--namespace", d.Namespace}, args...)...)
}

func cliResult(t *testing.T, d *harness.Daemon, stdin, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := d.Command(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s: no exit after %s; stdout %q, stderr %q", name, strings.Join(args, " "), cliTimeout, stdout.String(), stderr.String())
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return result{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

// mustNerdctl runs nerdctl and returns its standard output, failing the test unless it exits 0.
func mustNerdctl(t *testing.T, d *harness.Daemon, args ...string) string {
	t.Helper()
	r := nerdctlResult(t, d, "", args...)
	if r.code != 0 {
		t.Fatalf("nerdctl %s: exit status %d: %s", strings.Join(args, " "), r.code, strings.TrimSpace(r.stderr))
	}
	return r.stdout
}

// inspect is `nerdctl inspect -f FORMAT name`, trimmed.
func inspect(t *testing.T, d *harness.Daemon, name, format string) string {
	t.Helper()
	return strings.TrimSpace(mustNerdctl(t, d, "inspect", "-f", format, name))
}

// eventually polls cond until it returns nil, failing the test with its last error after 30 s.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// envInt is the number in environment variable name, def when it is unset; a test's knob below
// least (or not a number) fails the test.
func envInt(t *testing.T, name string, def, least int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		t.Fatalf("%s=%q: want a number >= %d", name, v, least)
	}
	return n
}

// waitForStatus waits until nerdctl reports container name in status (running, exited, paused...).
func waitForStatus(t *testing.T, d *harness.Daemon, name, status string) {
	t.Helper()
	eventually(t, name+" "+status, func() error {
		// An error too may only mean the container is not there yet.
		r := nerdctlResult(t, d, "", "inspect", "-f", "{{.State.Status}}", name)
		if got := strings.TrimSpace(r.stdout); r.code != 0 || got != status {
			return fmt.Errorf("status %q, %s", got, strings.TrimSpace(r.stderr))
		}
		return nil
	})
}

// waitForFile waits until the container's process has created path (as it sees it) in its root
// filesystem: how a workload says it is ready, e.g. has installed its signal handlers.
func waitForFile(t *testing.T, d *harness.Daemon, id, path string) {
	t.Helper()
	eventually(t, path+" in container "+id, func() error {
		_, err := os.Stat(filepath.Join(d.RootfsPath(id), path))
		return err
	})
}

// leftovers lists what of container id still exists after it was removed: a shim serving it, a
// mount below the daemon's directory for it, its cgroup (cgroupsPath) in any hierarchy.
func leftovers(d *harness.Daemon, id, cgroupsPath string) ([]string, error) {
	var left []string
	for _, pid := range shimproc.Find(d.Address, id) {
		left = append(left, fmt.Sprintf("shim pid %d", pid))
	}
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(d.Dir))
	if err != nil {
		return nil, err
	}
	for _, m := range mounts {
		if strings.Contains(m.Mountpoint, id) {
			left = append(left, "mount "+m.Mountpoint)
		}
	}
	cgroups, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, err
	}
	for _, m := range cgroups {
		p := filepath.Join(m.Mountpoint, cgroupsPath)
		if _, err := os.Stat(p); err == nil && cgroupsPath != "" {
			left = append(left, "cgroup "+p)
		}
	}
	return left, nil
}

// expectNoLeftovers waits (shims exit and cgroups go away asynchronously) until nothing of
// container id is left, and fails the test with what is when that does not happen.
func expectNoLeftovers(t *testing.T, d *harness.Daemon, id, cgroupsPath string) {
	t.Helper()
	eventually(t, "nothing left of "+id, func() error {
		left, err := leftovers(d, id, cgroupsPath)
		if err == nil && len(left) > 0 {
			err = fmt.Errorf("left behind: %s", strings.Join(left, ", "))
		}
		return err
	})
}

// waitFor is workload.Counter.WaitFor failing the test on error.
func (c counter) waitFor(t *testing.T, what string, ok func(workload.Count) bool) workload.Count {
	t.Helper()
	x, err := c.WaitFor(context.Background(), what, ok)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// startCommand starts cmd and returns a channel closed once it has exited; the end of the test
// kills it if it still runs.
func startCommand(t *testing.T, cmd *exec.Cmd) <-chan struct{} {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return done
}

// waitClosed waits up to 30 s for done, and fails the test waiting for what() otherwise.
func waitClosed(t *testing.T, done <-chan struct{}, what func() string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("waiting 30 s for %s", what())
	}
}
