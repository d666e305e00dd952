package runtime

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSeizeWatchHeld: the cgroup is held only when every thread it lists, read twice around the
// tracers, is traced by a CRIU.
func TestSeizeWatchHeld(t *testing.T) {
	const criu, gdb = 100, 200
	for _, tc := range []struct {
		name    string
		lists   [][]int     // what the cgroup lists at each read
		tracers map[int]int // thread -> tracer
		held    bool
	}{
		{name: "empty cgroup", lists: [][]int{{}, {}}},
		{name: "none traced", lists: [][]int{{1, 2}, {1, 2}}, tracers: map[int]int{}},
		{name: "some traced", lists: [][]int{{1, 2}, {1, 2}}, tracers: map[int]int{1: criu}},
		{name: "all traced by CRIU", lists: [][]int{{1, 2}, {1, 2}}, tracers: map[int]int{1: criu, 2: criu}, held: true},
		{name: "one traced by another tracer", lists: [][]int{{1, 2}, {1, 2}}, tracers: map[int]int{1: criu, 2: gdb}},
		{name: "a thread created meanwhile", lists: [][]int{{1, 2}, {1, 2, 3}}, tracers: map[int]int{1: criu, 2: criu}},
		{name: "a thread gone meanwhile", lists: [][]int{{1, 2}, {1}}, tracers: map[int]int{1: criu, 2: criu}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reads := 0
			w := newSeizeWatch("", "", func(pid int) bool { return pid == criu })
			w.threads = func() ([]int, error) {
				l := tc.lists[min(reads, len(tc.lists)-1)]
				reads++
				return l, nil
			}
			w.tracerOf = func(tid int) int { return tc.tracers[tid] }
			held, err := w.held()
			if err != nil || held != tc.held {
				t.Fatalf("held %t, %v; want %t", held, err, tc.held)
			}
		})
	}
}

// TestSeizeWatchPtrace: a watch of a cgroup listing a process's threads (a file standing for the
// cgroup's tasks) waits while they run, returns once this test has seized every one of them, and
// returns not held when stopped first.
func TestSeizeWatchPtrace(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: ptrace of a child")
	}
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	dir := t.TempDir()
	tids := threadsOf(t, child.Process.Pid)
	if err := os.WriteFile(filepath.Join(dir, "tasks"), []byte(strings.Join(tids, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The tracer is the thread this test seizes from.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	w := newSeizeWatch(dir, "tasks", func(pid int) bool { return pid == unix.Gettid() })

	stop := make(chan struct{})
	close(stop)
	if held, err := w.Wait(stop); held || err != nil {
		t.Fatalf("running threads: held %t, %v", held, err)
	}
	if err := unix.PtraceSeize(child.Process.Pid); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.PtraceDetach(child.Process.Pid) }()
	if held, err := w.Wait(make(chan struct{})); !held || err != nil {
		t.Fatalf("seized threads: held %t, %v", held, err)
	}
}

// TestCgroupThreads: the threads of a cgroup and of its sub-cgroups, sorted.
func TestCgroupThreads(t *testing.T) {
	dir := t.TempDir()
	for path, list := range map[string]string{"tasks": "7\n3\n", "sub/tasks": "5\n", "sub/deeper/tasks": ""} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, path)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, path), []byte(list), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := cgroupThreads(dir, "tasks")
	if err != nil || !slices.Equal(got, []int{3, 5, 7}) {
		t.Fatalf("got %v, %v", got, err)
	}
}

func threadsOf(t *testing.T, pid int) []string {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var tids []string
	for _, e := range entries {
		tids = append(tids, e.Name())
	}
	return tids
}
