package integration

// The fault-injection suite (issue 16): a process of the stack dies at a named step of a
// checkpoint or a rollback — the shim, the snapshotter (pkg/fault's points, armed through the
// daemon's fault file), or containerd (killed by the test while pkg/fault holds the shim at a
// step) — and once what died is started again, the container must be whole:
//
//   - it exists and its rootfs snapshot exists;
//   - its task runs, or is stopped and a new task starts and counts;
//   - every checkpoint listed for it restores and is verified (token and counter, and the marks
//     of the one made before the fault): nothing half-made is listed;
//   - no CRIU process of the daemon and no mount of the container is left, and once it is
//     removed and the leases a dead switch left are expired, no snapshot of it.
//
// Rounds are seeded (CKLITE_FAULT_SEED, default 1) and bounded: CKLITE_FAULT_ROUNDS per fault
// point, 1 in `make test`, 30 in `make test-faults`. The test logs a table of outcomes per point.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/fault"
)

// faultCase is a fault point and the operation it interrupts.
type faultCase struct {
	name  string
	point string // armed in the fault file
	// op: "checkpoint" (leave-running, Go client), "switch" (the same past the switch rule: 2 MiB
	// written, the task paused by the client), "rollback" (cklite rollback, in place), "fork"
	// (cklite fork) or "export" (cklite checkpoint export, fault_export_test.go).
	op string
	// crashContainerd: the point holds the shim and the test kills containerd meanwhile.
	crashContainerd bool
}

var faultCases = []faultCase{
	{name: "shim after CRIU dump", point: fault.ShimAfterDump, op: "checkpoint"},
	{name: "shim between switch prepare and update", point: fault.SwitchPrepared, op: "rollback"},
	{name: "shim between switch update and remove", point: fault.SwitchUpdated, op: "rollback"},
	{name: "snapshotter mid-commit", point: fault.SnapshotterCommit, op: "checkpoint"},
	{name: "containerd during checkpoint", point: fault.ShimAfterDump + ":hold", op: "checkpoint", crashContainerd: true},
	{name: "containerd during rollback", point: fault.SwitchPrepared + ":hold", op: "rollback", crashContainerd: true},
	{name: "fork's shim between switch update and remove", point: fault.SwitchUpdated, op: "fork"},
	{name: "shim between freeze lend and commit", point: fault.FreezeLent, op: "switch"},
	{name: "shim between freeze commit and move", point: fault.FreezeCommitted, op: "switch"},
	{name: "shim between freeze move and hand-over", point: fault.FreezeMoved, op: "switch"},
	{name: "shim between freeze hand-over and rename", point: fault.FreezeHandedOver, op: "switch"},
	{name: "shim between freeze rename and remove", point: fault.FreezeRenamed, op: "switch"},
	{name: "snapshotter mid-hand-over", point: fault.SnapshotterHandOver, op: "switch"},
	{name: "containerd during freeze", point: fault.FreezeMoved + ":hold", op: "switch", crashContainerd: true},
	{name: "export killed after its layers", point: fault.ExportLayers, op: "export"},
	{name: "export killed after its archive", point: fault.ExportArchive, op: "export"},
}

// selected reports whether fc runs: CKLITE_FAULT_POINTS, a comma-separated list of fault points
// (with or without ":hold"), picks cases; unset, all run.
func (fc faultCase) selected() bool {
	list := os.Getenv("CKLITE_FAULT_POINTS")
	if list == "" {
		return true
	}
	name, _, _ := strings.Cut(fc.point, ":")
	for _, p := range strings.Split(list, ",") {
		if p = strings.TrimSpace(p); p == fc.point || p == name {
			return true
		}
	}
	return false
}

// snapshotterPoint reports whether the fault kills the snapshotter.
func (fc faultCase) snapshotterPoint() bool {
	return strings.HasPrefix(fc.point, "snapshotter-")
}

// faultEnv is a checkpoint environment whose daemon honours a fault file.
type faultEnv struct {
	*ckEnv
	file string // the fault file; file+".hold" is the FIFO of hold points
}

func TestFaults(t *testing.T) {
	rounds := envInt(t, "CKLITE_FAULT_ROUNDS", 1, 1)
	seed := uint64(envInt(t, "CKLITE_FAULT_SEED", 1, 1))
	// A round takes seconds; the bound stops a hanging shim, not a slow round.
	e := newFaultEnv(t, time.Duration(rounds*len(faultCases))*2*time.Minute)
	var table faultTable
	t.Cleanup(func() { t.Logf("fault injection, seed %d:\n%s", seed, table.String()) })
	for ci, fc := range faultCases {
		if !fc.selected() {
			continue
		}
		t.Run(fc.name, func(t *testing.T) {
			for round := range rounds {
				rng := rand.New(rand.NewPCG(seed, uint64(ci*1000+round)))
				id := fmt.Sprintf("fault%d-r%03d", ci, round)
				outcome := e.round(t, fc, id, rng)
				table.add(fc.name, outcome)
				if t.Failed() {
					return
				}
			}
		})
	}
}

func newFaultEnv(t *testing.T, timeout time.Duration) *faultEnv {
	t.Helper()
	skipUnbuiltShim(t, harness.CkliteRuntime)
	dir := t.TempDir()
	file := filepath.Join(dir, "fault")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(file+".hold", 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, harness.Config{CkliteSnapshotter: true, FaultFile: file})
	unpackBusybox(t, d)
	ctx, cancel := context.WithTimeout(d.Context(context.Background()), timeout)
	t.Cleanup(cancel)
	e := &faultEnv{ckEnv: &ckEnv{d: d, ctx: ctx}, file: file}
	e.reconnect(t)
	return e
}

// reconnect takes the snapshotter and lease services and the image of the daemon's current
// client: a crash of containerd closes the old one.
func (e *faultEnv) reconnect(t *testing.T) {
	t.Helper()
	e.sn = e.d.Client().SnapshotService(ckliteSnapshotter)
	e.lm = e.d.Client().LeasesService()
	img, err := e.d.Client().GetImage(e.ctx, busybox.Name)
	if err != nil {
		t.Fatal(err)
	}
	e.img = img
}

func (e *faultEnv) arm(t *testing.T, spec string) {
	t.Helper()
	if err := os.WriteFile(e.file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
}

// faultOutcome is what a round saw.
type faultOutcome struct {
	opFailed    bool // the interrupted operation reported an error
	taskRunning bool // the task ran on (a rollback's or checkpoint's restore succeeded)
	listed      int  // checkpoints of the container listed after the fault, all verified
	madeListed  bool // the interrupted checkpoint is among them
}

// round runs one fault of fc on a new container id and checks what is left.
func (e *faultEnv) round(t *testing.T, fc faultCase, id string, rng *rand.Rand) faultOutcome {
	t.Helper()
	c, task, cnt := e.startCounter(t, id)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("processes in %s: %s", cnt.Rootfs, processesIn(cnt.Rootfs))
		}
	})
	tag := "fault-" + id
	_, metaA, atA := e.markedCheckpoint(t, task, cnt, tag)
	before := cnt.advance(t, 1+rng.IntN(4))
	changeMarks(t, cnt.Rootfs, tag)
	if fc.op == "switch" {
		writeBig(t, cnt.Rootfs)
	}

	opErr := e.interrupt(t, fc, c, task, metaA.ID, checkpointDir(t, e.d, id+"-B"))
	var out faultOutcome
	out.opFailed = opErr != nil
	t.Logf("%s: %s of %s ended with %v", fc.name, fc.op, id, opErr)

	// The container and its rootfs snapshot survive.
	c, err := e.d.Client().LoadContainer(e.ctx, id)
	if err != nil {
		t.Fatalf("container %s lost after %q: %v", id, fc.name, err)
	}
	info, err := c.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.sn.Stat(e.ctx, info.SnapshotKey); err != nil {
		t.Fatalf("container %s refers to rootfs snapshot %s after %q: %v", id, info.SnapshotKey, fc.name, err)
	}
	out.taskRunning = e.runningOrRestart(t, c, cnt, fc.name)
	if fc.op == "switch" {
		expectChangedFiles(t, cnt.Rootfs, tag)
	}
	if fc.op == "export" {
		e.expectExportRerun(t, id, metaA.ID)
	}

	// Every checkpoint listed restores and verifies.
	for _, r := range e.recordsOf(t, id) {
		t.Logf("verifying checkpoint %s of %s", r.ID, id)
		e.rollback(t, c, r.ImagePath)
		switch r.ID {
		case metaA.ID:
			expectRolledBack(t, cnt, atA, tag)
		default:
			out.madeListed = true
			x := cnt.advance(t, 1)
			if x.Token != before.Token || x.N < before.N {
				t.Fatalf("checkpoint %s, made during %q, restores to %+v, want token %s from count %d on", r.ID, fc.name, x, before.Token, before.N)
			}
		}
		out.listed++
	}
	e.expectNoCRIU(t)
	if fc.op == "fork" {
		e.removeFork(t, id+"-f-1")
	}
	e.removeAndExpectNothingLeft(t, c)
	return out
}

// interrupt runs fc's operation on c with fc's fault armed: a checkpoint of task into dirB, a
// rollback to checkpoint target, or a fork of it. It restarts what the fault killed and returns the operation's
// error.
func (e *faultEnv) interrupt(t *testing.T, fc faultCase, c client.Container, task client.Task, target, dirB string) error {
	t.Helper()
	done := make(chan error, 1)
	e.arm(t, fc.point)
	go func() {
		switch fc.op {
		case "checkpoint":
			done <- e.checkpointErr(task, dirB, nil)
		case "fork":
			_, err := e.d.Cklite(e.ctx, "fork", "-n", "1", "--prefix", c.ID()+"-f", target)
			done <- err
		case "switch":
			done <- e.checkpointErr(task, dirB, nil)
		case "export":
			done <- e.export(c.ID(), target)
		default:
			_, err := e.d.Cklite(e.ctx, "rollback", c.ID(), target)
			done <- err
		}
	}()
	restarted := make(chan error, 1)
	if fc.snapshotterPoint() {
		// As a supervisor would, the snapshotter is started again as soon as it died: the
		// operation may wait for it (a freeze does).
		go func() {
			if !e.d.SnapshotterExited(time.Minute) {
				restarted <- fmt.Errorf("the snapshotter did not reach %s during the %s", fc.point, fc.op)
				return
			}
			if err := os.WriteFile(e.file, nil, 0o644); err != nil {
				restarted <- err
				return
			}
			restarted <- e.d.StartSnapshotter()
		}()
	}
	if fc.crashContainerd {
		e.crashWhileHeld(t, done)
	}
	err := <-done
	e.arm(t, "")
	exited := false
	if fc.snapshotterPoint() {
		if rerr := <-restarted; rerr != nil {
			t.Fatalf("restarting the snapshotter: %v (the operation: %v)", rerr, err)
		}
		exited = true
	} else if e.d.SnapshotterExited(0) { // a fault of the shim or containerd must not kill it
		if err := e.d.StartSnapshotter(); err != nil {
			t.Fatalf("restarting the snapshotter: %v", err)
		}
		exited = true
	}
	if exited {
		// containerd's proxy redials the new snapshotter after its connection's backoff. A Stat
		// of a key containerd knows reaches the snapshotter (a lost key is the caller's finding).
		eventually(t, "containerd to reach the restarted snapshotter", func() error {
			info, err := c.Info(e.ctx)
			if err == nil {
				_, err = e.sn.Stat(e.ctx, info.SnapshotKey)
			}
			if errdefs.IsNotFound(err) {
				return nil
			}
			return err
		})
	}
	return err
}

// crashWhileHeld waits until the shim is held at the armed point, kills containerd, lets the shim
// go on (its next calls to containerd find nobody) and starts containerd again.
func (e *faultEnv) crashWhileHeld(t *testing.T, done chan error) {
	t.Helper()
	opened := make(chan *os.File, 1)
	go func() {
		f, err := os.OpenFile(e.file+".hold", os.O_WRONLY, 0) // blocks until the shim holds
		if err == nil {
			opened <- f
		}
	}()
	select {
	case f := <-opened:
		if err := e.d.Crash(e.ctx); err != nil {
			f.Close()
			t.Fatalf("crashing containerd: %v", err)
		}
		f.Close()
	case err := <-done:
		// Release the writer blocked on the FIFO before failing.
		if r, oerr := os.OpenFile(e.file+".hold", os.O_RDONLY|unix.O_NONBLOCK, 0); oerr == nil {
			r.Close()
		}
		t.Fatalf("the operation ended (%v) before the shim reached the held point", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the shim did not reach the held point within 2 minutes")
	}
	e.reconnect(t)
}

// runningOrRestart checks the container's task: running and counting, or gone or stopped, when
// it is deleted and a new task must start and count. It reports whether the task ran on.
func (e *faultEnv) runningOrRestart(t *testing.T, c client.Container, cnt counter, what string) bool {
	t.Helper()
	var running bool
	eventually(t, "containerd to settle the task after "+what, func() error {
		task, err := c.Task(e.ctx, nil)
		if errdefs.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		st, err := task.Status(e.ctx)
		if err != nil {
			return err
		}
		switch st.Status {
		case client.Running:
			running = true
			return nil
		case client.Paused:
			// The Go client pauses a non-runc task around its checkpoint and resumes it after;
			// killed with containerd in between, it leaves the task paused, as it would a runc
			// one: resuming it is the client's (or the operator's) part, and the same process
			// must then run on.
			if err := task.Resume(e.ctx); err != nil {
				return err
			}
			return errors.New("resumed the task the dead client had paused, checking again")
		case client.Stopped, client.Unknown:
			_, err := task.Delete(e.ctx, client.WithProcessKill)
			if err == nil || errdefs.IsNotFound(err) {
				return errors.New("deleted the stopped task, checking again")
			}
			return err
		}
		return fmt.Errorf("task is %s", st.Status)
	})
	if running {
		t.Logf("after %q the task runs", what)
		cnt.advance(t, 1)
		return true
	}
	e.deleteDeadTask(t, c)
	// The rootfs holds what the dead task, or the checkpoint a switch stacked it on, wrote last:
	// a count above 0 (the rounds advance it before the fault). The new task writes 0 first.
	task := e.startAgain(t, c)
	cnt.waitFor(t, "the new task's first count", func(x workload.Count) bool { return x.N == 0 })
	x := cnt.advance(t, 2)
	t.Logf("after %q the task had stopped; a new one (pid %d) counts: %+v", what, task.Pid(), x)
	return false
}

// recordsOf lists the checkpoints of container id, oldest first.
func (e *faultEnv) recordsOf(t *testing.T, id string) []checkpoint.Record {
	t.Helper()
	var recs []checkpoint.Record
	for _, r := range e.records(t) {
		if r.Container == id {
			recs = append(recs, r)
		}
	}
	slices.SortFunc(recs, func(a, b checkpoint.Record) int { return a.Created.Compare(b.Created) })
	return recs
}

// expectNoCRIU fails the test if a CRIU process works in the daemon's state directory (where the
// bundles are): no fault may leave one behind.
func (e *faultEnv) expectNoCRIU(t *testing.T) {
	t.Helper()
	eventually(t, "no CRIU process left", func() error {
		procs, err := os.ReadDir("/proc")
		if err != nil {
			return err
		}
		for _, p := range procs {
			pid, err := strconv.Atoi(p.Name())
			if err != nil || !criuAlive(pid) {
				continue
			}
			if cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); strings.HasPrefix(cwd, e.d.Dir) {
				return fmt.Errorf("CRIU %d still works in %s", pid, cwd)
			}
		}
		return nil
	})
}

// removeFork removes the fork named name if the failed fork left it (cklite fork removes a fork
// that failed), as nerdctl rm would; a fork left running must run.
func (e *faultEnv) removeFork(t *testing.T, name string) {
	t.Helper()
	forks, err := e.d.Client().Containers(e.ctx, fmt.Sprintf("labels.%q==%s", "nerdctl/name", name))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		t.Logf("the interrupted fork left container %s (%s): removing it", f.ID(), name)
		e.deleteTask(t, f)
		if err := f.Delete(e.ctx, client.WithSnapshotCleanup); err != nil {
			t.Fatalf("removing fork %s: %v", f.ID(), err)
		}
	}
}

// removeAndExpectNothingLeft deletes c with its snapshot, as nerdctl rm does, and checks that no
// mount or shim of it is left, and, once the leases of dead switches are expired, no rootfs
// snapshot that no container refers to.
func (e *faultEnv) removeAndExpectNothingLeft(t *testing.T, c client.Container) {
	t.Helper()
	e.deleteTask(t, c)
	if err := c.Delete(e.ctx, client.WithSnapshotCleanup); err != nil {
		t.Fatalf("removing %s: %v", c.ID(), err)
	}
	expectNoLeftovers(t, e.d, c.ID(), "")
	e.expireWorkLeases(t)
	e.collectGarbage(t)
	if stray := e.strayRootfs(t); len(stray) > 0 {
		t.Fatalf("after removing %s, active snapshots no container refers to: %v", c.ID(), stray)
	}
}

// strayRootfs lists the active snapshots in cklite that no container's record names, and the
// views (an export's).
func (e *faultEnv) strayRootfs(t *testing.T) []string {
	t.Helper()
	ctrs, err := e.d.Client().Containers(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, c := range ctrs {
		info, err := c.Info(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		used[info.SnapshotKey] = true
	}
	var stray []string
	err = e.sn.Walk(e.ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Kind == snapshots.KindView || info.Kind == snapshots.KindActive && !used[info.Name] {
			stray = append(stray, info.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return stray
}

// expireWorkLeases deletes every lease but the checkpoints', as their expiry would: a switch
// that died before it updated its container leaves the fresh key to its lease.
func (e *faultEnv) expireWorkLeases(t *testing.T) {
	t.Helper()
	all, err := e.lm.List(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range all {
		if _, ok := l.Labels[checkpoint.LabelID]; ok {
			continue
		}
		if err := e.lm.Delete(e.ctx, l); err != nil && !errdefs.IsNotFound(err) {
			t.Fatal(err)
		}
	}
}

// faultTable counts outcomes per fault point.
type faultTable struct {
	mu    sync.Mutex
	names []string
	rows  map[string]*faultRow
}

type faultRow struct {
	rounds, opFailed, running, restarted, listed, madeListed int
}

func (ft *faultTable) add(name string, o faultOutcome) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	if ft.rows == nil {
		ft.rows = map[string]*faultRow{}
	}
	r, ok := ft.rows[name]
	if !ok {
		r = &faultRow{}
		ft.rows[name] = r
		ft.names = append(ft.names, name)
	}
	r.rounds++
	if o.opFailed {
		r.opFailed++
	}
	if o.taskRunning {
		r.running++
	} else {
		r.restarted++
	}
	r.listed += o.listed
	if o.madeListed {
		r.madeListed++
	}
}

// String is the table as docs/reliability.md shows it.
func (ft *faultTable) String() string {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	var b strings.Builder
	b.WriteString("| fault point | rounds passed | operation failed | task ran on | task stopped, restarted | checkpoints listed (all restored and verified) | interrupted checkpoint listed |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, n := range ft.names {
		r := ft.rows[n]
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d |\n", n, r.rounds, r.opFailed, r.running, r.restarted, r.listed, r.madeListed)
	}
	return b.String()
}

// processesIn lists the processes whose root directory is rootfs, for failure messages.
func processesIn(rootfs string) string {
	var found []string
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if root, err := os.Readlink("/proc/" + p.Name() + "/root"); err == nil && root == rootfs {
			cmd, _ := os.ReadFile("/proc/" + p.Name() + "/cmdline")
			found = append(found, p.Name()+" "+strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return strings.Join(found, "; ")
}
