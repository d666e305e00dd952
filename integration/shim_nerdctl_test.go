package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/shimproc"
	"github.com/cklite/cklite/integration/workload"
)

// The TestShim tests in this file use nerdctl the way a user does, against each runtime.

// TestShimRunDetached is `nerdctl run -d` on a bridge network: the container runs, its root
// filesystem is mounted where containerd expects the bundle's, and the network nerdctl's OCI
// createRuntime hook set up is inside the container's network namespace.
func TestShimRunDetached(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		network := bridgeNetwork(t, d)
		id := runDetached(t, d, rt, "web", []string{"--net", network}, "sleep", "3600")
		waitForStatus(t, d, "web", "running")
		if pid, _ := strconv.Atoi(inspect(t, d, "web", "{{.State.Pid}}")); pid <= 0 {
			t.Fatalf("running container has pid %d", pid)
		}
		if out := mustNerdctl(t, d, "ps", "--format", "{{.Names}} {{.Status}}"); !strings.Contains(out, "web Up") {
			t.Fatalf("nerdctl ps does not list web as up:\n%s", out)
		}
		if _, err := os.Stat(filepath.Join(d.RootfsPath(id), "bin", "busybox")); err != nil {
			t.Fatalf("the container's root filesystem is not mounted at the bundle's rootfs: %v", err)
		}
		ip := inspect(t, d, "web", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
		if ip == "" {
			t.Fatal("nerdctl gave the container no IP address")
		}
		if out := mustNerdctl(t, d, "exec", "web", "ip", "-4", "addr", "show", "eth0"); !strings.Contains(out, ip+"/") {
			t.Fatalf("eth0 in the container does not have the address %s nerdctl reports:\n%s", ip, out)
		}
	})
}

// bridgeNetwork creates an internal bridge network for one test, and removes it with the host's
// bridge device (which CNI leaves behind) when the test ends. nerdctl's default network would
// not do: its subnet and bridge name are fixed, so it collides with other daemons' on the host.
// ipamDir is where CNI's host-local IPAM reserves the addresses of nerdctl's network name: a
// file per address.
func ipamDir(network string) string { return filepath.Join("/var/lib/cni/networks", network) }

func bridgeNetwork(t *testing.T, d *harness.Daemon) string {
	t.Helper()
	name := "shimtest-" + d.Namespace
	subnet := fmt.Sprintf("10.213.%d.0/24", rand.IntN(256))
	mustNerdctl(t, d, "network", "create", "--internal", "--subnet", subnet, name)
	t.Cleanup(func() {
		// Containers first: CNI's DEL must run while the network exists.
		if ids := strings.Fields(mustNerdctl(t, d, "ps", "-aq")); len(ids) > 0 {
			mustNerdctl(t, d, append([]string{"rm", "-f"}, ids...)...)
		}
		mustNerdctl(t, d, "network", "rm", name)
		// CNI's host-local IPAM keeps a directory per network, which nerdctl leaves behind.
		if err := os.RemoveAll(ipamDir(name)); err != nil {
			t.Error(err)
		}
		// nerdctl names a network's bridge br-<the first 12 hex digits of sha256(name)>.
		sum := sha256.Sum256([]byte(name))
		bridge := "br-" + hex.EncodeToString(sum[:])[:12]
		if out, err := exec.Command("ip", "link", "delete", bridge).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
			t.Errorf("removing the bridge %s: %v: %s", bridge, err, out)
		}
		removeIsolationRules(t, bridge)
	})
	return name
}

// removeIsolationRules deletes the iptables rules CNI's firewall plugin added for bridge in its
// isolation chains, which no CNI DEL removes.
func removeIsolationRules(t *testing.T, bridge string) {
	t.Helper()
	for _, chain := range []string{"CNI-ISOLATION-STAGE-1", "CNI-ISOLATION-STAGE-2"} {
		out, err := exec.Command("iptables", "-S", chain).Output()
		if err != nil {
			continue // no such chain: nothing was added
		}
		for _, rule := range strings.Split(string(out), "\n") {
			if !strings.HasPrefix(rule, "-A ") || !strings.Contains(rule, " "+bridge+" ") {
				continue
			}
			// -S prints the rule quoted as a shell would take it.
			if out, err := exec.Command("sh", "-c", "iptables -D "+strings.TrimPrefix(rule, "-A ")).CombinedOutput(); err != nil {
				t.Errorf("removing the iptables rule %q: %v: %s", rule, err, out)
			}
		}
	}
}

// TestShimExec is `nerdctl exec`: output and exit codes of exec'd processes.
func TestShimExec(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		runDetached(t, d, rt, "box", nil, "sleep", "3600")
		if out := mustNerdctl(t, d, "exec", "box", "echo", "hello"); out != "hello\n" {
			t.Fatalf("exec echo hello printed %q", out)
		}
		r := nerdctlResult(t, d, "", "exec", "box", "sh", "-c", "exit 4")
		// nerdctl 2.2 exits 1 whatever the exec's code, and reports the code.
		if r.code == 0 || !execExitRE.MatchString(r.stderr) || execExitRE.FindStringSubmatch(r.stderr)[1] != "4" {
			t.Fatalf("exec of `exit 4`: nerdctl exited %d, stderr %q; want the exit code 4 reported", r.code, r.stderr)
		}
		// An exec of a binary that is not there fails and names it.
		if r := nerdctlResult(t, d, "", "exec", "box", "/no/such/binary"); r.code == 0 || !strings.Contains(r.stderr, "/no/such/binary") {
			t.Fatalf("exec of a missing binary: exit %d, stderr %q", r.code, r.stderr)
		}
		// The exec'd processes are gone and the container is still fine.
		if out := mustNerdctl(t, d, "exec", "box", "sh", "-c", "echo $$"); strings.TrimSpace(out) == "" {
			t.Fatal("exec after the failed ones printed nothing")
		}
		waitForStatus(t, d, "box", "running")
	})
}

// TestShimStaysInHostNamespaces starts containers with bind mounts (nerdctl's /etc files), for
// which libcontainer joins the container's mount namespace on a locked thread of its own, and
// checks each shim's main thread (what /proc/PID/ns names) is still in the host's mount and
// network namespaces and exec works. Before the shim kept its main thread to itself, that thread
// was now and then the one libcontainer took, and stayed in the container's mount namespace: the
// exec guard then refused every exec ("init ... is in the host's mnt namespace") and Stats found
// no cgroup mount.
func TestShimStaysInHostNamespaces(t *testing.T) {
	d := shimDaemon(t)
	for i := range 8 {
		name := fmt.Sprintf("home-%d", i)
		runDetached(t, d, harness.CkliteRuntime, name, nil, "sleep", "3600")
		pid, err := strconv.Atoi(inspect(t, d, name, "{{.State.Pid}}"))
		if err != nil {
			t.Fatal(err)
		}
		shim := parentOf(t, pid)
		for _, ns := range []string{"mnt", "net"} {
			own, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", shim, ns))
			host, err2 := os.Readlink("/proc/self/ns/" + ns)
			if err1 != nil || err2 != nil || own != host {
				t.Fatalf("shim %d of %s: %s namespace %s (%v), the host's %s (%v)", shim, name, ns, own, err1, host, err2)
			}
		}
		if out := mustNerdctl(t, d, "exec", name, "echo", "hello"); out != "hello\n" {
			t.Fatalf("exec in %s printed %q", name, out)
		}
	}
}

// parentOf is the parent of process pid (a container init's is its shim).
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			ppid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return ppid
		}
	}
	t.Fatalf("no PPid in /proc/%d/status", pid)
	return 0
}

// TestShimStdin feeds a container's `cat` a line on stdin and, once cat has echoed it, closes
// stdin (CloseIO): cat must exit. For the task's init process through `ctr run`, for an exec'd
// one through `nerdctl exec -i`. (nerdctl 2.2's `run -i` never closes the container's stdin,
// whatever the runtime; ctr closes it only if its stdin ends after the task was created, hence
// the wait for the echo.)
func TestShimStdin(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		runDetached(t, d, rt, "box", nil, "sleep", "3600")
		t.Run("init", func(t *testing.T) {
			catStdin(t, d.Command(context.Background(), "ctr", "--address", d.Address, "--namespace", d.Namespace,
				"run", "--rm", "--fifo-dir", d.FIFODir(), "--runtime", rt, busybox.Name, "cat-init", "cat"))
		})
		t.Run("exec", func(t *testing.T) {
			catStdin(t, d.Command(context.Background(), "nerdctl", "exec", "-i", "box", "cat"))
		})
		// All of stdin at once: nerdctl may close it (CloseIO) before the exec has started.
		t.Run("exec, stdin ended at once", func(t *testing.T) {
			if r := nerdctlResult(t, d, "from stdin\n", "exec", "-i", "box", "cat"); r.code != 0 || r.stdout != "from stdin\n" {
				t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
			}
		})
	})
}

// catStdin runs cmd, a CLI running `cat` in a container, writes a line to its stdin, waits for
// the echo, closes stdin and expects the CLI to exit 0.
func catStdin(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	done := startCommand(t, cmd)
	if _, err := io.WriteString(stdin, "from stdin\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "cat to echo its input", func() error {
		if !strings.Contains(out.String(), "from stdin\n") {
			return fmt.Errorf("output so far %q", out.String())
		}
		return nil
	})
	stdin.Close()
	waitClosed(t, done, func() string {
		return fmt.Sprintf("cat to exit at the end of its stdin; stdout %q, stderr %q", out.String(), stderr.String())
	})
	if code := cmd.ProcessState.ExitCode(); code != 0 || out.String() != "from stdin\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out.String(), stderr.String())
	}
}

// lockedBuffer is a bytes.Buffer safe to read while a command writes to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestShimLogs is `nerdctl logs`: the container's stdout and stderr, kept apart.
func TestShimLogs(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		runDetached(t, d, rt, "talker", nil, "sh", "-c", "echo to-stdout; echo to-stderr >&2; echo more-stdout")
		if code := strings.TrimSpace(mustNerdctl(t, d, "wait", "talker")); code != "0" {
			t.Fatalf("nerdctl wait printed %q, want 0", code)
		}
		r := nerdctlResult(t, d, "", "logs", "talker")
		if r.code != 0 || r.stdout != "to-stdout\nmore-stdout\n" || r.stderr != "to-stderr\n" {
			t.Fatalf("nerdctl logs: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})
}

// TestShimStop is `nerdctl stop`: SIGTERM, and SIGKILL after the timeout for a process that
// ignores SIGTERM, as PID 1 without a handler does.
func TestShimStop(t *testing.T) {
	cases := []struct {
		name string
		cmd  string
		code string
	}{
		{"handles SIGTERM", `trap "exit 7" TERM; touch /ready; while :; do sleep 0.1; done`, "7"},
		{"ignores SIGTERM", `touch /ready; exec sleep 3600`, "137"},
	}
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				id := runDetached(t, d, rt, "stop-me", nil, "sh", "-c", tc.cmd)
				waitForFile(t, d, id, "ready")
				mustNerdctl(t, d, "stop", "-t", "1", "stop-me")
				if code := inspect(t, d, "stop-me", "{{.State.ExitCode}}"); code != tc.code {
					t.Fatalf("exit code after nerdctl stop: %s, want %s", code, tc.code)
				}
				mustNerdctl(t, d, "rm", "stop-me")
			})
		}
	})
}

// TestShimKill is `nerdctl kill`: -s delivers the signal to the container's process, and the
// default SIGKILL ends it with code 137.
func TestShimKill(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		id := runDetached(t, d, rt, "target", nil, "sh", "-c", `trap "touch /got-usr1" USR1; touch /ready; while :; do sleep 0.1; done`)
		waitForFile(t, d, id, "ready")
		mustNerdctl(t, d, "kill", "-s", "USR1", "target")
		waitForFile(t, d, id, "got-usr1")
		waitForStatus(t, d, "target", "running")
		mustNerdctl(t, d, "kill", "target")
		waitForStatus(t, d, "target", "exited")
		if code := inspect(t, d, "target", "{{.State.ExitCode}}"); code != "137" {
			t.Fatalf("exit code after nerdctl kill: %s, want 137", code)
		}
	})
}

// TestShimPauseUnpause is `nerdctl pause` and `unpause`: a paused container's process is frozen
// (its counter stops), and counts again once unpaused.
func TestShimPauseUnpause(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		id := runDetached(t, d, rt, "counter", nil, "sh", "-c", workload.CounterScript)
		c := newCounter(d.RootfsPath(id))
		start := c.advance(t, 1)
		// Counting freely from here on.
		if err := os.WriteFile(filepath.Join(c.Rootfs, "tmp", "run"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		c.waitFor(t, "counting", func(x workload.Count) bool { return x.N > start.N })

		mustNerdctl(t, d, "pause", "counter")
		waitForStatus(t, d, "counter", "paused")
		frozen := c.waitFor(t, "a count", func(workload.Count) bool { return true })
		// Seeing that nothing happens takes time: 25 rounds of the counter's loop.
		time.Sleep(500 * time.Millisecond)
		if now := c.waitFor(t, "a count", func(workload.Count) bool { return true }); now != frozen {
			t.Fatalf("the counter went from %+v to %+v while paused", frozen, now)
		}

		mustNerdctl(t, d, "unpause", "counter")
		waitForStatus(t, d, "counter", "running")
		c.waitFor(t, fmt.Sprintf("counting on past %d", frozen.N), func(x workload.Count) bool {
			return x.Token == frozen.Token && x.N > frozen.N+3
		})
	})
}

// TestShimStats is `nerdctl stats --no-stream`: the shim's cgroup metrics show the container's
// memory use.
func TestShimStats(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		runDetached(t, d, rt, "box", nil, "sleep", "3600")
		out := strings.TrimSpace(mustNerdctl(t, d, "stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}} {{.PIDs}}", "box"))
		m := regexp.MustCompile(`^box ([0-9.]+)([KMG]i)?B / \S+ (\d+)$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("nerdctl stats printed %q, want NAME USAGE / LIMIT PIDS", out)
		}
		if mem, _ := strconv.ParseFloat(m[1], 64); mem <= 0 {
			t.Fatalf("nerdctl stats reports no memory use: %q", out)
		}
		if m[3] != "1" {
			t.Fatalf("nerdctl stats reports %s pids for one sleep: %q", m[3], out)
		}
	})
}

// TestShimTop is `nerdctl top`: the container's processes, as the shim lists them.
func TestShimTop(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		runDetached(t, d, rt, "box", nil, "sh", "-c", "sleep 3600 & sleep 3601")
		pid := inspect(t, d, "box", "{{.State.Pid}}")
		// The background sleep may not have started when run -d returns.
		eventually(t, "nerdctl top to list both sleeps", func() error {
			out := mustNerdctl(t, d, "top", "box")
			for _, want := range []string{"sleep 3600", "sleep 3601"} {
				if !strings.Contains(out, want) {
					return fmt.Errorf("no %q in:\n%s", want, out)
				}
			}
			if !regexp.MustCompile(`(?m)^\S+\s+` + pid + `\s`).MatchString(out) {
				return fmt.Errorf("no line for the container's pid %s in:\n%s", pid, out)
			}
			return nil
		})
	})
}

// TestShimRemoveRunning is `nerdctl rm -f` of a running container: nothing of it is left, no task,
// no shim, no mount, no cgroup.
func TestShimRemoveRunning(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		id := runDetached(t, d, rt, "doomed", nil, "sleep", "3600")
		ctx := d.Context(context.Background())
		container, err := d.Client().LoadContainer(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		spec, err := container.Spec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A check that sees nothing of a running container would miss leaks too.
		left, err := leftovers(d, id, spec.Linux.CgroupsPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, kind := range []string{"shim ", "mount ", "cgroup "} {
			if !slices.ContainsFunc(left, func(s string) bool { return strings.HasPrefix(s, kind) }) {
				t.Fatalf("found no %sof the running container, only %v", kind, left)
			}
		}
		mustNerdctl(t, d, "rm", "-f", "doomed")
		if _, err := d.Client().LoadContainer(ctx, id); !errdefs.IsNotFound(err) {
			t.Fatalf("container still known to containerd after rm -f (%v)", err)
		}
		if _, err := d.Client().TaskService().Get(ctx, &tasks.GetRequest{ContainerID: id}); !errdefs.IsNotFound(errgrpc.ToNative(err)) {
			t.Fatalf("task still known to containerd after rm -f (%v)", err)
		}
		expectNoLeftovers(t, d, id, spec.Linux.CgroupsPath)
	})
}

// TestShimExitCodes checks the container's exit code becomes `nerdctl run`'s: the workload's own
// code, and 128+9 for a container killed by SIGKILL while nerdctl is attached.
func TestShimExitCodes(t *testing.T) {
	cases := []struct {
		name string
		cmd  string
		code int
	}{
		{"exit 0", "exit 0", 0},
		{"exit 3", "exit 3", 3},
		{"exit 255", "exit 255", 255},
	}
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				r := nerdctlResult(t, d, "", "run", "--rm", "--runtime", rt, "--net", "none", busybox.Name, "sh", "-c", tc.cmd)
				if r.code != tc.code {
					t.Fatalf("nerdctl run of `%s` exited %d, want %d; stderr %q", tc.cmd, r.code, tc.code, r.stderr)
				}
			})
		}
		t.Run("killed", func(t *testing.T) {
			cmd := d.Command(context.Background(), "nerdctl", "run", "--rm", "--runtime", rt, "--net", "none", "--name", "victim", busybox.Name, "sleep", "3600")
			done := startCommand(t, cmd)
			waitForStatus(t, d, "victim", "running")
			mustNerdctl(t, d, "kill", "victim")
			waitClosed(t, done, func() string { return "nerdctl run to return after its container was killed" })
			if code := cmd.ProcessState.ExitCode(); code != 137 {
				t.Fatalf("nerdctl run of a container killed by SIGKILL exited %d, want 137", code)
			}
		})
	})
}

// TestShimRestartPolicy is `nerdctl run --restart=always`: containerd's restart monitor (which polls
// every 10 s) starts a new task in the container when its task exits, through the container's
// runtime. The workload records its starts in a bind-mounted host file, and stays up the second
// time.
func TestShimRestartPolicy(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		dir := t.TempDir()
		id := runDetached(t, d, rt, "phoenix", []string{"--restart=always", "-v", dir + ":/data"}, "sh", "-c",
			`echo started >> /data/starts; if [ $(grep -c started /data/starts) -ge 2 ]; then exec sleep 3600; fi; exit 1`)
		eventually(t, "a restart of the container", func() error {
			data, err := os.ReadFile(filepath.Join(dir, "starts"))
			if n := strings.Count(string(data), "started"); err == nil && n != 2 {
				err = fmt.Errorf("started %d times", n)
			}
			return err
		})
		waitForStatus(t, d, "phoenix", "running")
		pids := shimproc.Find(d.Address, id)
		if len(pids) != 1 {
			t.Fatalf("%d shims serve the restarted container, want 1", len(pids))
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pids[0])); err != nil || filepath.Base(exe) != shimproc.Binary(rt) {
			t.Fatalf("the restarted container's shim runs %q (%v), want %s", exe, err, shimproc.Binary(rt))
		}
	})
}
