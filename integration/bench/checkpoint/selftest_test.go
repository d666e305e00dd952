package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The self-test runs every workload of the benchmark on a fake of each system, which keeps its
// container as a directory and its agent as a goroutine speaking the counter's and the probe's
// protocol, and injects failures into operations of both: the run must go on, record each
// failure where it happened, retry the transient one once and finish with a complete result set.
// `make bench-selftest` runs it; it needs neither root nor containerd.

// injection makes the nth call (from 1, counted over the whole run) of one operation of a fake
// system fail, times times in a row (a retry is a call too).
type injection struct {
	op     string // "checkpoint", "rollback" or "fork"
	nth    int
	times  int
	errMsg string
}

// fakeSystem keeps its sandboxes under dir.
type fakeSystem struct {
	dir    string
	inject []injection
	mu     sync.Mutex
	calls  map[string]int
	// interrupt, when set, is called at the interruptAt-th checkpoint: a ^C during the run.
	interrupt   func()
	interruptAt int
	// store makes its sandboxes memoryStores, as cklite's are.
	store bool
}

// fail says whether this call of op is to fail, and with what.
func (s *fakeSystem) fail(op string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[op]++
	if s.interrupt != nil && op == "checkpoint" && s.calls[op] == s.interruptAt {
		s.interrupt()
	}
	for _, in := range s.inject {
		if in.op == op && s.calls[op] >= in.nth && s.calls[op] < in.nth+in.times {
			return errors.New(in.errMsg)
		}
	}
	return nil
}

func (s *fakeSystem) resetPeak()   {}
func (s *fakeSystem) peak() uint64 { return 0 }

func (s *fakeSystem) start(id string, _ agentSpec) (sandbox, error) {
	b := &fakeBox{sys: s, cid: id, dir: filepath.Join(s.dir, id)}
	for _, d := range []string{"tmp", "etc", projectDir + "/edits"} {
		if err := os.MkdirAll(filepath.Join(b.rootfs(), d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Join(b.dir, "snaps"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(b.rootfs(), "etc", "passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
		return nil, err
	}
	b.run(agentState{token: "agent-" + id, probe: "probe-" + id})
	if s.store {
		return &fakeStoreBox{fakeBox: b, taken: map[int]bool{}, settled: map[int]bool{}}, nil
	}
	return b, nil
}

// fakeStoreBox is a fakeBox whose checkpoints' memory (fakeMemory bytes each) is stored at a
// quarter of its size once the store is done with it, as cklite's memory store does in the
// background: measuring a checkpoint the benchmark did not settle first fails.
type fakeStoreBox struct {
	*fakeBox
	taken, settled map[int]bool
}

const fakeMemory = 4096

func (b *fakeStoreBox) checkpoint(i int) error {
	if err := b.fakeBox.checkpoint(i); err != nil {
		return err
	}
	b.taken[i], b.settled[i] = true, false
	return nil
}

func (b *fakeStoreBox) settle(i int) error {
	b.settled[i] = b.taken[i]
	return nil
}

func (b *fakeStoreBox) checkpointID(i int) string { return fmt.Sprintf("%s-%d", b.cid, i) }

// storedAgainst: the fake stores every checkpoint as a full dump's quarter, against no parent.
func (b *fakeStoreBox) storedAgainst(int) (string, error) { return "", nil }

func (b *fakeStoreBox) memoryDisk() (logical, stored int64, err error) {
	for i := range b.taken {
		if !b.settled[i] {
			return 0, 0, fmt.Errorf("checkpoint %d measured before the store was done with it", i)
		}
		logical, stored = logical+fakeMemory, stored+fakeMemory/4
	}
	return logical, stored, nil
}

// agentState is the fake agent's memory: what a checkpoint keeps and a restore brings back.
type agentState struct {
	token, probe string
	n, ticks     int
}

// fakeBox is a container of the fake: its rootfs a directory, its checkpoints copies of it and
// of the agent's state.
type fakeBox struct {
	sys      *fakeSystem
	cid, dir string
	mu       sync.Mutex // held while the "process" is frozen: checkpoint, rollback
	state    agentState
	snaps    map[int]agentState
	stop     chan struct{}
	done     chan struct{}
	execs    uint32 // exec'd processes started
}

func (b *fakeBox) id() string             { return b.cid }
func (b *fakeBox) rootfs() string         { return filepath.Join(b.dir, "rootfs") }
func (b *fakeBox) snap(i int) string      { return filepath.Join(b.dir, "snaps", fmt.Sprint(i)) }
func (b *fakeBox) diskDirs() []string     { return []string{filepath.Join(b.dir, "snaps")} }
func (b *fakeBox) fsDisk() (int64, error) { return diskUsage(b.diskDirs()...) }
func (b *fakeBox) shimPeak() uint64       { return 0 }

func (b *fakeBox) criu(int) (criuStats, error) { return criuStats{frozen: time.Millisecond}, nil }

// run starts the agent from state st: every 2 ms, like CounterScript, it counts while /tmp/run
// exists, editing a project file as the agent does, and writes /tmp/count; like the probe it
// ticks, writes /tmp/probe and logs gaps over 10 ms (the time it was frozen) to /tmp/gaps.
func (b *fakeBox) run(st agentState) {
	b.state, b.stop, b.done = st, make(chan struct{}), make(chan struct{})
	if b.snaps == nil {
		b.snaps = map[int]agentState{}
	}
	go func() {
		defer close(b.done)
		last := time.Now()
		for {
			select {
			case <-b.stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			b.mu.Lock()
			now := time.Now()
			if gap := now.Sub(last); gap > 10*time.Millisecond {
				appendFile(filepath.Join(b.rootfs(), "tmp", "gaps"), fmt.Sprintf("%d %d\n", now.UnixNano(), gap.Nanoseconds()))
			}
			last = now
			b.tick()
			b.mu.Unlock()
		}
	}()
}

func (b *fakeBox) tick() {
	st, root := &b.state, b.rootfs()
	state := "idle"
	if _, err := os.Stat(filepath.Join(root, "tmp", "run")); err == nil {
		st.n++
		state = "run"
		_ = os.WriteFile(filepath.Join(root, projectDir, "edits", fmt.Sprintf("e%d", st.n%editFiles)), []byte(fmt.Sprintf("%s %d\n", st.token, st.n)), 0o644)
	}
	st.ticks++
	_ = writeAtomic(filepath.Join(root, "tmp", "count"), []byte(fmt.Sprintf("%s %d %s\n", st.token, st.n, state)))
	_ = writeAtomic(filepath.Join(root, "tmp", "probe"), []byte(fmt.Sprintf("%s %d 0\n", st.probe, st.ticks)))
}

func appendFile(name, line string) {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err == nil {
		_, _ = f.WriteString(line)
		_ = f.Close()
	}
}

func (b *fakeBox) checkpoint(i int) error {
	if err := b.sys.fail("checkpoint"); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	time.Sleep(15 * time.Millisecond) // frozen long enough for the probe to log a gap
	if err := copyTree(b.rootfs(), b.snap(i)); err != nil {
		return err
	}
	b.snaps[i] = b.state
	return nil
}

func (b *fakeBox) rollback(i int) error {
	if err := b.sys.fail("rollback"); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := os.RemoveAll(b.rootfs()); err != nil {
		return err
	}
	if err := copyTree(b.snap(i), b.rootfs()); err != nil {
		return err
	}
	b.state = b.snaps[i]
	return nil
}

func (b *fakeBox) fork(i, n int, prefix string) ([]sandbox, []time.Duration, error) {
	if err := b.sys.fail("fork"); err != nil {
		return nil, nil, err
	}
	var forks []sandbox
	var took []time.Duration
	for k := 1; k <= n; k++ {
		start := time.Now()
		f := &fakeBox{sys: b.sys, cid: fmt.Sprintf("%s-%d", prefix, k), dir: filepath.Join(b.sys.dir, fmt.Sprintf("%s-%d", prefix, k))}
		if err := copyTree(b.snap(i), f.rootfs()); err != nil {
			return nil, nil, errors.Join(err, closeForks(forks))
		}
		f.run(b.snaps[i])
		forks, took = append(forks, f), append(took, time.Since(start))
	}
	return forks, took, nil
}

// exec and startExec run nothing: the fake has no processes but its agent. Its exec'd
// "processes" are numbers that run until the box closes.
func (b *fakeBox) exec(...string) error { return b.sys.fail("exec") }

func (b *fakeBox) startExec(...string) (uint32, error) {
	if err := b.sys.fail("exec"); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.execs++
	return b.execs, nil
}

func (b *fakeBox) execsRunning(pids []uint32) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, pid := range pids {
		if pid == 0 || pid > b.execs {
			return fmt.Errorf("exec'd process %d never started", pid)
		}
	}
	return nil
}

func (b *fakeBox) close() error {
	close(b.stop)
	<-b.done
	return os.RemoveAll(b.dir)
}

// copyTree copies the directories and regular files under src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, 0o644)
	})
}

func TestSelftest(t *testing.T) {
	out := t.TempDir()
	o, err := parseOptions([]string{"-out", out, "-checkpoints", "4", "-rollbacks", "3",
		"-mem-mb", "1", "-rootfs-mb", "2", "-agent-files", "30", "-forks", "1,3",
		"-tree-expansions", "12", "-tree-rollbacks", "4", "-tree-depth", "4", "-tree-files", "30",
		"-history-checkpoints", "5", "-forked", "2", "-forked-checkpoints", "2"})
	if err != nil {
		t.Fatal(err)
	}
	// Calls are counted over the whole run; idle goes first, with 4 checkpoints and 3 rollbacks
	// a system, then memory, filesystem, agent, the agent history (5 checkpoints, cklite only),
	// exec (cklite only: 4 checkpoints without and 4 with exec'd processes), fan-out (one
	// checkpoint and one fork -n per count a system), fork checkpoints (cklite only: the origin's
	// checkpoint, 2 of each of 2 forks), tree search.
	cklite := &fakeSystem{dir: filepath.Join(out, "cklite"), calls: map[string]int{}, store: true, inject: []injection{
		// Idle's third checkpoint fails for good: its rollbacks go to the other three.
		{op: "checkpoint", nth: 3, times: 2, errMsg: "OCI runtime pause failed: unable to freeze"},
		// The tree search's node 3: 17 checkpoints of the series before it (idle's retry
		// included), the history's 5, exec's 8, fan-out's one, fork checkpoints' 5, the tree's
		// nodes 0-2.
		{op: "checkpoint", nth: 17 + 5 + 8 + 1 + 5 + 3 + 1, times: 1, errMsg: "criu dump failed: injected"},
	}}
	stock := &fakeSystem{dir: filepath.Join(out, "stock"), calls: map[string]int{}, inject: []injection{
		// Idle's second rollback fails once with a transient error: the retry succeeds.
		{op: "rollback", nth: 2, times: 1, errMsg: "OCI runtime pause failed: unable to freeze"},
		// The fan-out's first fork -n fails.
		{op: "fork", nth: 1, times: 1, errMsg: "OCI runtime restore failed: injected"},
		// The tree search's first rollback (13 rollbacks of the series before it, idle's retry
		// included).
		{op: "rollback", nth: 13 + 1, times: 1, errMsg: "criu restore failed: injected"},
	}}
	var log strings.Builder
	e := &env{ctx: context.Background(), systems: map[string]system{"cklite": cklite, "stock": stock},
		rec: &recorder{}, log: &log, started: time.Now()}
	if err := e.runAll(o); err != nil {
		t.Fatalf("runAll: %v\n%s", err, log.String())
	}
	failed, _ := e.rec.tally()
	if got, want := failed, 4; got != want {
		t.Errorf("%d operations failed, want %d:\n%s", got, want, log.String())
	}
	if got, want := exitStatus(failed, nil), exitFailures; got != want {
		t.Errorf("exit status %d, want %d", got, want)
	}

	results := readCSV(t, filepath.Join(out, "results.csv"))
	failedCol := func(workload, sys string) string {
		for _, r := range results {
			if r["workload"] == workload {
				return r[sys+"_failed"] + "/" + r[sys+"_retried"]
			}
		}
		t.Fatalf("no row for workload %s in results.csv", workload)
		return ""
	}
	value := func(workload, metric, sys string) string {
		for _, r := range results {
			if r["workload"] == workload && r["metric"] == metric {
				return r[sys]
			}
		}
		t.Fatalf("no row %s %s in results.csv", workload, metric)
		return ""
	}
	for _, c := range []struct{ workload, sys, want string }{
		{"idle", "cklite", "1/1"}, {"idle", "stock", "0/1"},
		{"memory", "cklite", "0/0"}, {"filesystem", "stock", "0/0"}, {"agent", "cklite", "0/0"},
		{"tree search", "cklite", "1/0"}, {"tree search", "stock", "1/0"},
	} {
		if got := failedCol(c.workload, c.sys); got != c.want {
			t.Errorf("%s, %s: failed/retried %s, want %s", c.workload, c.sys, got, c.want)
		}
	}
	for _, c := range []struct{ workload, metric, sys, want string }{
		// Every rollback made was verified, the failed ones were not made.
		{"idle", "restores made", "cklite", "3.000"}, {"idle", "restores verified", "cklite", "3.000"},
		{"idle", "restores verified", "stock", "3.000"},
		{"memory", "restores verified", "stock", "3.000"},
		{"filesystem", "restores verified", "cklite", "3.000"},
		{"agent", "restores verified", "stock", "3.000"},
		{"fan-out", "restores verified", "cklite", "1.000"},
		// Stock's fork -n 1 failed and shows no figures; its fork -n 3 ran.
		{"fan-out", "fork total", "stock", ""},
		// cklite's memory store, measured once settled: 4 checkpoints of 4 KiB stored in 1 KiB
		// each; stock has none.
		{"memory", "  memory (logical)", "cklite", "0.016"}, {"memory", "  of it memory (stored)", "cklite", "0.004"},
		{"memory", "  memory dedup ratio", "cklite", "4.000"}, {"memory", "  memory dedup ratio", "stock", ""},
		{"tree search", "  memory dedup ratio", "cklite", "4.000"},
		// The history: 5 checkpoints stored in 5/4 of one; stock left out.
		{"agent-history", "  memory stored in full dumps", "cklite", "1.250"}, {"agent-history", "disk after 5 ckpts", "stock", ""},
		{"agent-history", "restores verified", "cklite", "3.000"},
		// 2 forks verified, then each rolled back to its checkpoint 1 and verified.
		{"fork checkpoints", "restores verified", "cklite", "4.000"},
		// runc cannot checkpoint exec'd processes: stock takes no such checkpoint.
		{"exec", "checkpoint, 5 execs p50", "stock", ""},
	} {
		if got := value(c.workload, c.metric, c.sys); got != c.want {
			t.Errorf("%s %s, %s: %q, want %q", c.workload, c.metric, c.sys, got, c.want)
		}
	}
	var fanout3 bool
	for _, r := range results {
		fanout3 = fanout3 || (r["param"] == "3 forks" && r["metric"] == "restores verified" && r["stock"] == "3.000" && r["cklite"] == "3.000")
	}
	if !fanout3 {
		t.Errorf("fan-out of 3: not every fork verified on both systems")
	}

	failures := readCSV(t, filepath.Join(out, "failures.csv"))
	var lines []string
	for _, f := range failures {
		lines = append(lines, strings.Join([]string{f["system"], f["workload"], f["step"], f["error"], f["retried_after"]}, " | "))
	}
	got := strings.Join(lines, "\n")
	for _, want := range []string{
		"cklite | idle | checkpoint 2 | OCI runtime pause failed: unable to freeze | OCI runtime pause failed: unable to freeze",
		"stock | idle | rollback to checkpoint 3 |  | OCI runtime pause failed: unable to freeze",
		"stock | fan-out | fork -n 1 | OCI runtime restore failed: injected | ",
		"cklite | tree search | checkpoint of node 3 | criu dump failed: injected | ",
		"stock | tree search | rollback to node",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("failures.csv lacks %q; it holds:\n%s", want, got)
		}
	}
	for _, name := range []string{"results.md", "tree-breakdown.svg", "fork-total-vs-n.svg", "latency-vs-rootfs.svg"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Error(err)
		}
	}
	t.Log(log.String())
	md, _ := os.ReadFile(filepath.Join(out, "results.md"))
	if !strings.Contains(string(md), "| idle | busybox counter | checkpoint p50 |") || !strings.Contains(string(md), "| 1 / 0 | 1 / 1 |") {
		t.Errorf("results.md lacks idle's row with its failed and retried columns:\n%s", md)
	}
}

// An interrupt (^C) in the middle of a workload stops the run: the workloads finished before it
// are written, the interrupted one is not recorded as failures, and what the run started is gone.
func TestSelftestInterrupted(t *testing.T) {
	out := t.TempDir()
	o, err := parseOptions([]string{"-out", out, "-checkpoints", "3", "-rollbacks", "1", "-mem-mb", "1", "-rootfs-mb", "", "-agent-files", "0", "-forks", "", "-tree-expansions", "0",
		"-history-checkpoints", "0", "-forked", "0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// idle takes cklite's checkpoints 1-3; the memory workload's first is interrupted, and stock's
	// steps after it in that round meet the cancelled context.
	cklite := &fakeSystem{dir: filepath.Join(out, "cklite"), calls: map[string]int{}, interrupt: cancel, interruptAt: 4}
	stock := &fakeSystem{dir: filepath.Join(out, "stock"), calls: map[string]int{}}
	var log strings.Builder
	e := &env{ctx: ctx, systems: map[string]system{"cklite": cklite, "stock": stock}, rec: &recorder{}, log: &log, started: time.Now()}
	err = e.runAll(o)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("runAll: %v, want context.Canceled\n%s", err, log.String())
	}
	if got := exitStatus(0, err); got != 1 {
		t.Errorf("exit status %d, want 1", got)
	}
	workloads := map[string]bool{}
	for _, r := range readCSV(t, filepath.Join(out, "results.csv")) {
		workloads[r["workload"]] = true
	}
	if !workloads["idle"] || workloads["memory"] {
		t.Errorf("results.csv holds the workloads %v, want idle alone", workloads)
	}
	if f := readCSV(t, filepath.Join(out, "failures.csv")); len(f) != 0 {
		t.Errorf("failures.csv holds %v, want none", f)
	}
	for _, dir := range []string{cklite.dir, stock.dir} {
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("%s still holds %d sandboxes", dir, len(left))
		}
	}
}

// A system whose tree search lost its root has no node to go back to: its replay ends there,
// recorded once, while the other system's runs to the end.
func TestSelftestTreeRootFails(t *testing.T) {
	out := t.TempDir()
	o, err := parseOptions([]string{"-out", out, "-only", "tree", "-tree-expansions", "6", "-tree-rollbacks", "2", "-tree-files", "10"})
	if err != nil {
		t.Fatal(err)
	}
	cklite := &fakeSystem{dir: filepath.Join(out, "cklite"), calls: map[string]int{},
		inject: []injection{{op: "checkpoint", nth: 1, times: 1, errMsg: "criu dump failed: injected"}}}
	stock := &fakeSystem{dir: filepath.Join(out, "stock"), calls: map[string]int{}}
	var log strings.Builder
	e := &env{ctx: context.Background(), systems: map[string]system{"cklite": cklite, "stock": stock}, rec: &recorder{}, log: &log, started: time.Now()}
	if err := e.runAll(o); err != nil {
		t.Fatalf("runAll: %v\n%s", err, log.String())
	}
	if failed, _ := e.rec.tally(); failed != 1 || cklite.calls["checkpoint"] != 1 {
		t.Errorf("%d failures, %d cklite checkpoints tried; want 1 and 1\n%s", failed, cklite.calls["checkpoint"], log.String())
	}
	if stock.calls["checkpoint"] != 7 || stock.calls["rollback"] != 2 {
		t.Errorf("stock: %v, want 7 checkpoints and 2 rollbacks", stock.calls)
	}
	if left, _ := os.ReadDir(cklite.dir); len(left) != 0 {
		t.Errorf("cklite's container was not removed when its tree search ended")
	}
}

// readCSV reads a CSV file with a header into one map per row.
func readCSV(t *testing.T, name string) []map[string]string {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	head, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	for {
		rec, err := r.Read()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for i, h := range head {
			m[h] = rec[i]
		}
		out = append(out, m)
	}
}
