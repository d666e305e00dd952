package runtime

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/opencontainers/cgroups"
)

// A leave-running dump holds the container's tasks from CRIU's seize to its end, so what the
// dump does not hold (the rootfs upper, which the shim captures) can be read beside it rather than
// after it. With a freezer cgroup (libcontainer always gives CRIU one, cgroup v1 or v2), CRIU
// (criu/seize.c, freeze_processes) freezes the cgroup, or finds it frozen, reads every thread of
// it and its sub-cgroups, PTRACE_SEIZEs and PTRACE_INTERRUPTs each while they are frozen, then
// thaws the cgroup for the rest of the dump: a thawed thread then stops in the interrupt's trap
// before it can return to user space. At the end CRIU freezes the cgroup again (it found it
// frozen, or leave_frozen) and detaches. From the moment every thread of the cgroup is traced by
// that CRIU, no thread of the container runs its own code until the caller thaws it, and no new
// thread can appear: the rootfs is still.
//
// SeizeWatch waits for that moment: every thread listed by the cgroup (tasks, or cgroup.threads
// on v2) is traced by a CRIU this process started (the tracer's executable is named criu and its
// parent is this process, so neither a debugger in the container nor a program of the container
// called criu counts), and the list read again after the tracers is the same (a thread created
// in between is not held). CRIU seizes only while the cgroup is frozen, so a thread seen traced by
// it was seized frozen. If CRIU fails to seize (a zombie, a thread traced by something else) it
// thaws the cgroup and the dump fails: the caller drops what it captured. The guarantee holds
// until the dump ends; after it, only a cgroup still frozen (CRIU's leave_frozen, or a freeze
// CRIU found) keeps the tasks still, which the caller checks as before.

// seizePoll is how often a SeizeWatch looks: CRIU seizes ~20 ms after its start and dumps for
// tens of milliseconds more, so a millisecond late costs nothing, and a look reads one file per
// thread (a few tens of microseconds).
const seizePoll = time.Millisecond

// SeizeWatch watches the container's cgroup for the moment CRIU holds every thread of it.
type SeizeWatch struct {
	dir, list string         // the freezer cgroup's directory, and the file listing its threads
	isCRIU    func(int) bool // whether a tracer is a CRIU of this process
	criu      map[int]bool   // tracers already checked
	tracerOf  func(int) int  // the tracer of a thread, 0 for none
	poll      time.Duration  // the interval between looks
	threads   func() ([]int, error)
}

// WatchSeized prepares a SeizeWatch of the container's freezer cgroup; call it before
// Checkpoint (libcontainer's state is read under the lock its dump holds).
func (c *Container) WatchSeized() (*SeizeWatch, error) {
	st, err := c.lc.State()
	if err != nil {
		return nil, wrap("container state", err)
	}
	dir, list := st.CgroupPaths["freezer"], "tasks"
	if cgroups.IsCgroup2UnifiedMode() {
		dir, list = st.CgroupPaths[""], "cgroup.threads"
	}
	if dir == "" {
		return nil, fmt.Errorf("container %s has no freezer cgroup: CRIU seizes its tasks one by one", c.lc.ID())
	}
	return newSeizeWatch(dir, list, isCRIUChild), nil
}

func newSeizeWatch(dir, list string, isCRIU func(int) bool) *SeizeWatch {
	w := &SeizeWatch{dir: dir, list: list, isCRIU: isCRIU, criu: map[int]bool{}, tracerOf: tracerOf, poll: seizePoll}
	w.threads = func() ([]int, error) { return cgroupThreads(w.dir, w.list) }
	return w
}

// Wait waits until CRIU holds every thread of the cgroup (held) or stop is closed. An error
// says that the cgroup could not be read: the caller cannot know when the tasks are held.
func (w *SeizeWatch) Wait(stop <-chan struct{}) (held bool, err error) {
	t := time.NewTicker(w.poll)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return false, nil
		default:
		}
		if held, err := w.held(); held || err != nil {
			return held, err
		}
		select {
		case <-stop:
			return false, nil
		case <-t.C:
		}
	}
}

// held looks once.
func (w *SeizeWatch) held() (bool, error) {
	before, err := w.threads()
	if err != nil || len(before) == 0 {
		return false, err
	}
	for _, tid := range before {
		tracer := w.tracerOf(tid)
		if tracer == 0 {
			return false, nil
		}
		ok, seen := w.criu[tracer]
		if !seen {
			ok = w.isCRIU(tracer)
			w.criu[tracer] = ok
		}
		if !ok {
			return false, nil
		}
	}
	after, err := w.threads()
	if err != nil {
		return false, err
	}
	return slices.Equal(before, after), nil
}

// cgroupThreads lists the threads of cgroup dir and of its sub-cgroups (CRIU seizes them all),
// sorted, from each one's list file.
func cgroupThreads(dir, list string) ([]int, error) {
	var tids []int
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		data, err := os.ReadFile(filepath.Join(path, list))
		if err != nil {
			return fmt.Errorf("threads of cgroup %s: %w", path, err)
		}
		s := bufio.NewScanner(bytes.NewReader(data))
		for s.Scan() {
			tid, err := strconv.Atoi(s.Text())
			if err != nil {
				return fmt.Errorf("threads of cgroup %s: %w", path, err)
			}
			tids = append(tids, tid)
		}
		return nil
	})
	slices.Sort(tids)
	return tids, err
}

// isCRIUChild tells whether pid is a CRIU this process started (libcontainer's criu swrk,
// through the wrapper, which executes it in place).
func isCRIUChild(pid int) bool {
	return isCRIU(pid) && parentOf(pid) == os.Getpid()
}

// parentOf is pid's parent, or 0.
func parentOf(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command (in parentheses, which may hold anything): state, ppid.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(data[i+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(string(f[1]))
	return ppid
}
