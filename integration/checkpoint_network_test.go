package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cklite/cklite/integration/harness"
)

// TestCheckpointNetwork: a leave-running checkpoint keeps the container's network namespace
// (the same namespace, its CNI interface and address, lo up), and a rollback comes back with a
// configured network, where stock runc restores into a fresh namespace with lo down.
func TestCheckpointNetwork(t *testing.T) {
	e := newCkEnv(t)
	network := bridgeNetwork(t, e.d)
	const name = "netns"
	runDetached(t, e.d, harness.CkliteRuntime, name, []string{"--snapshotter", ckliteSnapshotter, "--net", network}, "sleep", "3600")
	waitForStatus(t, e.d, name, "running")

	before := readNetState(t, e, name)
	if before.ip == "" || !before.loUp {
		t.Fatalf("before any checkpoint the container has no address on eth0 or lo down: %+v", before)
	}

	mustNerdctl(t, e.d, "checkpoint", "create", "--leave-running", name, "net1")
	waitForStatus(t, e.d, name, "running")
	after := readNetState(t, e, name)
	if after.pid != before.pid {
		t.Fatalf("init had pid %d before the checkpoint, %d after: a leave-running checkpoint restored it", before.pid, after.pid)
	}
	if after.netns != before.netns || after.ip != before.ip || !after.loUp {
		t.Fatalf("a leave-running checkpoint changed the network: before %+v, after %+v", before, after)
	}

	// A rollback in place keeps the namespace and what CNI put in it: the first in-place restore
	// destroys the engine the container was created with, and a poststop hook run there (nerdctl's
	// CNI teardown) would take eth0 and its address away from the restored task.
	m := createdID.FindStringSubmatch(cklite(t, e.d, "checkpoint", "create", name))
	if m == nil {
		t.Fatal("cklite checkpoint create printed no checkpoint id")
	}
	for i := range 2 {
		cklite(t, e.d, "rollback", name, m[1])
		waitForStatus(t, e.d, name, "running")
		rolled := readNetState(t, e, name)
		if rolled.netns != before.netns || rolled.ip != before.ip || !rolled.loUp {
			t.Fatalf("rollback %d in place changed the network: before %+v, after %+v", i+1, before, rolled)
		}
	}
	// nerdctl's poststop hook, its CNI teardown, also frees the container's name and releases its
	// address: run at a rollback, it would have let another container take both.
	if r := nerdctlResult(t, e.d, "", "create", "--net", "none", "--name", name, busybox.Name, "true"); r.code == 0 || !strings.Contains(r.stderr, "already used") {
		t.Fatalf("nerdctl create --name %s after the rollbacks: exit %d, %s; want the name still in use", name, r.code, r.stderr)
	}
	reserved := filepath.Join(ipamDir(network), strings.Split(before.ip, "/")[0])
	if _, err := os.Stat(reserved); err != nil {
		t.Fatalf("the address %s is no longer reserved by CNI's IPAM after the rollbacks: %v", before.ip, err)
	}

	// The hook runs once, when the task is deleted: the engine the rollbacks made keeps it.
	mustNerdctl(t, e.d, "stop", "-t", "0", name)
	if _, err := os.Stat(reserved); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the address %s is still reserved after the rolled-back task's stop (%v): its poststop hook did not run", before.ip, err)
	}
	e.collectGarbage(t) // no collection pending to race nerdctl's start (see TestCheckpointTerminalNerdctl)
	mustNerdctl(t, e.d, "start", "--checkpoint", "net1", name)
	waitForStatus(t, e.d, name, "running")
	rolled := readNetState(t, e, name)
	if rolled.ip == "" || !rolled.loUp {
		t.Fatalf("rolled back, the container has no address on eth0 or lo down: %+v", rolled)
	}
	t.Logf("address before the checkpoint %s, after the rollback %s", before.ip, rolled.ip)

	// Without CNI (the Go client's default spec): the rollback's new namespace has lo up.
	c, task, _ := e.startCounter(t, "lo")
	dir := checkpointDir(t, e.d, "lo")
	e.checkpointTo(t, task, dir, nil)
	task = e.rollback(t, c, dir)
	if lo := e.exec(t, task, "ip", "link", "show", "lo"); !strings.Contains(lo, ",UP") {
		t.Fatalf("rolled back without CNI, lo is not up:\n%s", lo)
	}
}

// netState is what a container's network looks like from the host and from inside.
type netState struct {
	pid   int
	netns string // the namespace's identity, "net:[inode]"
	ip    string // eth0's IPv4 address
	loUp  bool
}

func readNetState(t *testing.T, e *ckEnv, name string) netState {
	t.Helper()
	pid, err := strconv.Atoi(inspect(t, e.d, name, "{{.State.Pid}}"))
	if err != nil || pid <= 0 {
		t.Fatalf("pid of %s: %q %v", name, inspect(t, e.d, name, "{{.State.Pid}}"), err)
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := netState{pid: pid, netns: ns}
	for _, f := range strings.Fields(mustNerdctl(t, e.d, "exec", name, "ip", "-4", "-o", "addr", "show", "eth0")) {
		if strings.Count(f, ".") == 3 && strings.Contains(f, "/") {
			s.ip = f
			break
		}
	}
	lo := mustNerdctl(t, e.d, "exec", name, "ip", "link", "show", "lo")
	s.loUp = strings.Contains(lo, ",UP") || strings.Contains(lo, "<UP")
	return s
}
