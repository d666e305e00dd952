package integration

// The forks tests are issue 13 item 4's: forks of a nerdctl container are containers of their
// own, to nerdctl as to the kernel, and outlive the container they were forked from.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
)

// TestForksIndependent: 10 forks (the seed of make test-forks) of a nerdctl container on a CNI
// network, with --network.
func TestForksIndependent(t *testing.T) { testForks(t, 10) }

// TestForksMany is make test-forks: CKLITE_TEST_FORKS forks (100 there) must all start, without
// one spurious failure. Skipped unless the variable is set.
func TestForksMany(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("CKLITE_TEST_FORKS"))
	if err != nil || n < 1 {
		t.Skip("set CKLITE_TEST_FORKS to the number of forks (make test-forks)")
	}
	testForks(t, n)
}

// forkScript is the counter at 2 rounds a second, with a line on stdout every second for nerdctl
// logs. The usual 50 rounds a second, each forking, in every fork would keep a cgroup v1 freezer
// from freezing any of them on a loaded machine ("pause: unable to freeze": each task must be
// scheduled to freeze), whatever cklite does.
var forkScript = `(while :; do echo tick; sleep 1; done) & ` + strings.Replace(workload.CounterScript, "sleep 0.02", "sleep 0.5", 1)

// forkLine is what `cklite fork` prints for a fork that runs: its name and short id.
var forkRunningRE = regexp.MustCompile(`(?m)^  (\S+) \(([0-9a-f]{12})\) running, restored in \S+$`)

// testForks forks a nerdctl container n times and checks each fork is a container of its own: a
// nerdctl name (exec, logs, ps, rm by name; the parent's name still unambiguous), its own
// /etc/hosts, /etc/resolv.conf, /etc/hostname and hostname, its own address on the parent's
// network; then removes the parent with nerdctl and checkpoints and rolls back the forks (at most
// 10 of them), and removes them by name.
func testForks(t *testing.T, n int) {
	if !strings.Contains(forkScript, "sleep 0.5") {
		t.Fatal("the counter script no longer sleeps 0.02 s a round: update forkScript")
	}
	e := newCkEnv(t)
	// A fork may take a minute on a loaded machine: ckTimeout is for one container.
	ctx, cancel := context.WithTimeout(e.d.Context(context.Background()), ckTimeout+time.Duration(n)*time.Minute)
	t.Cleanup(cancel)
	e.ctx = ctx
	network := bridgeNetwork(t, e.d)
	const parent = "web"
	parentID := runDetached(t, e.d, harness.CkliteRuntime, parent, []string{"--snapshotter", ckliteSnapshotter, "--net", network}, "sh", "-c", forkScript)
	waitForStatus(t, e.d, parent, "running")
	parentNet := readNetState(t, e, parent)
	parentResolv := mustNerdctl(t, e.d, "exec", parent, "cat", "/etc/resolv.conf")

	out := cklite(t, e.d, "checkpoint", "create", parentID)
	ck := regexp.MustCompile(`checkpoint ([0-9a-f]{12}) `).FindStringSubmatch(out)
	if ck == nil {
		t.Fatalf("cklite checkpoint create printed no id:\n%s", out)
	}
	start := time.Now()
	out, err := e.d.Cklite(e.ctx, "fork", "--network", "-n", strconv.Itoa(n), ck[1])
	logTiming(t, fmt.Sprintf("cklite fork --network -n %d", n), start)
	running := forkRunningRE.FindAllStringSubmatch(out, -1)
	if err != nil || len(running) != n {
		t.Fatalf("cklite fork -n %d: %d forks running, error %v:\n%s", n, len(running), err, out)
	}
	names := make([]string, n)
	for i, m := range running {
		names[i] = m[1]
	}
	slices.Sort(names)
	ids := forkIDsByName(t, e, names)

	ps := mustNerdctl(t, e.d, "ps", "--format", "{{.Names}}")
	ips := map[string]string{parentNet.ip: parent}
	for i, name := range names {
		if !slices.Contains(strings.Fields(ps), name) {
			t.Fatalf("nerdctl ps does not list %s:\n%s", name, ps)
		}
		hostname := ids[i][:12]
		// One exec a fork: nerdctl is slow on a loaded machine.
		got := strings.Split(mustNerdctl(t, e.d, "exec", name, "sh", "-c",
			`cat /etc/hostname; echo ---; hostname; echo ---; cat /etc/hosts; echo ---; ip -4 -o addr show eth0; echo ---; ip link show lo;`+
				` echo nameserver 10.9.9.9 > /etc/resolv.conf`), "---\n")
		if len(got) != 5 {
			t.Fatalf("%s: exec printed %q", name, got)
		}
		if got[0] != hostname+"\n" || strings.TrimSpace(got[1]) != hostname {
			t.Fatalf("%s's /etc/hostname holds %q and its hostname is %q, want its own, %q", name, got[0], got[1], hostname)
		}
		if !strings.Contains(got[2], hostname) {
			t.Fatalf("%s's /etc/hosts does not name its host %s:\n%s", name, hostname, got[2])
		}
		ip := regexp.MustCompile(`inet (\S+)`).FindStringSubmatch(got[3])
		if ip == nil || !strings.Contains(got[4], "UP") {
			t.Fatalf("%s has no address on eth0, or lo down:\n%s%s", name, got[3], got[4])
		}
		if other, ok := ips[ip[1]]; ok {
			t.Fatalf("%s has address %s, as %s has", name, ip[1], other)
		}
		ips[ip[1]] = name
		if cgroups := forkCgroups(t, e, ids[i]); strings.Contains(cgroups, parentID) {
			t.Fatalf("%s's processes are in the parent's cgroups:\n%s", name, cgroups)
		}
		// The fork's log file is there from the start, as nerdctl run makes it, and its output
		// reaches it: nerdctl's logging binary stopped for good when its first State of the task
		// failed, which it did when the restore at Start took containerd's 2 s (shim.State).
		eventually(t, "nerdctl logs of "+name, func() error {
			r := nerdctlResult(t, e.d, "", "logs", name)
			if r.code != 0 {
				t.Fatalf("nerdctl logs %s: exit status %d: %s", name, r.code, strings.TrimSpace(r.stderr))
			}
			if !strings.Contains(r.stdout, "tick") {
				return fmt.Errorf("no tick in %q", r.stdout)
			}
			return nil
		})
	}
	if got := mustNerdctl(t, e.d, "exec", parent, "cat", "/etc/resolv.conf"); got != parentResolv {
		t.Fatalf("the forks rewrote the parent's /etc/resolv.conf: %q, was %q", got, parentResolv)
	}
	if got := inspect(t, e.d, parent, "{{.ID}}"); got != parentID {
		t.Fatalf("nerdctl inspect %s found %s, want the parent %s", parent, got, parentID)
	}

	start = time.Now()
	mustNerdctl(t, e.d, "rm", "-f", parent)
	logTiming(t, "nerdctl rm -f of the parent", start)

	for i, name := range names[:min(n, 10)] {
		c := newCounter(e.d.RootfsPath(ids[i]))
		writeMarks(t, c.Rootfs, name)
		at := c.advance(t, 3)
		out := cklite(t, e.d, "checkpoint", "create", name) // by nerdctl name, as nerdctl takes it
		fk := regexp.MustCompile(`checkpoint ([0-9a-f]{12}) `).FindStringSubmatch(out)
		if fk == nil {
			t.Fatalf("cklite checkpoint create of %s printed no id:\n%s", name, out)
		}
		waitForStatus(t, e.d, name, "running")
		changeMarks(t, c.Rootfs, name)
		cklite(t, e.d, "rollback", name, fk[1])
		expectRolledBack(t, c, at, name)
		waitForStatus(t, e.d, name, "running")
	}

	nerdctlRoot := filepath.Join(e.d.Dir, "nerdctl")
	for i, name := range names {
		mustNerdctl(t, e.d, "rm", "-f", name)
		dirs, _ := filepath.Glob(filepath.Join(nerdctlRoot, "*", "*", e.d.Namespace, ids[i]))
		names, _ := filepath.Glob(filepath.Join(nerdctlRoot, "*", "names", e.d.Namespace, name))
		if len(dirs)+len(names) > 0 {
			t.Fatalf("after nerdctl rm %s: %v left", name, append(dirs, names...))
		}
		// Forks and rollbacks switched its rootfs to fresh keys (freeze.Switch): rm finds them.
		if keys := e.rootfsSnapshots(t, ids[i]); len(keys) > 0 {
			t.Fatalf("after nerdctl rm %s: its rootfs snapshots %v left", name, keys)
		}
	}
}

// forkCgroups is /proc/PID/cgroup of container id's init.
func forkCgroups(t *testing.T, e *ckEnv, id string) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", e.taskOf(t, id).Pid()))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// rootfsSnapshots lists the rootfs snapshots of container id (ownSnapshot) in cklite.
func (e *ckEnv) rootfsSnapshots(t *testing.T, id string) []string {
	t.Helper()
	var keys []string
	err := e.sn.Walk(e.ctx, func(_ context.Context, info snapshots.Info) error {
		if ownSnapshot(id, info.Name) {
			keys = append(keys, info.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// ownSnapshot reports whether snapshot key is a rootfs of container id: its first key or one a
// switch made ("<id>-<8 hex>").
func ownSnapshot(id, key string) bool {
	return key == id || strings.HasPrefix(key, id+"-") && len(key) == len(id)+9
}
