package shim

import (
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/cklite/cklite/runtime"
)

// Whether the container's PID 1 reaps. An exec in the tree is an orphan of the container's PID 1
// (treeexec.go), which must reap it; a PID 1 that never waits (`sleep infinity`, `python
// app.py`, common in Kubernetes and agent sandboxes) leaves every one a zombie, and enough execs
// exhaust the container's pids. The shim learns it from the execs themselves, with no timer: it
// remembers the tree execs that exited (pid and start time, and when it saw the exit) and looks at
// them again at each new exec. One still a zombie of the same start time more than reapGrace
// after its exit, or reapZombies of them zombies at once, and PID 1 does not reap: from then on
// the container's execs run as the shim's children, which the shim reaps (and a checkpoint is
// refused while one runs, captureExecs). An exit found reaped is forgotten.
//
// Zombies are thus bounded: those left by the execs that exited before the decision, which are
// fewer than reapZombies when it is taken at an exec that follows the others' exits (sequential
// execs), plus the execs of the tree still running at that point. Kept per container, in memory:
// a new shim (a restart, a restore elsewhere) learns it again.
const (
	reapGrace   = time.Second
	reapZombies = 16
)

// reapCheck is what a container's shim knows of its PID 1's reaping. Its zero value knows
// nothing yet: PID 1 is taken to reap.
type reapCheck struct {
	mu     sync.Mutex
	exits  []treeExit // exits not yet found reaped
	noReap bool
}

type treeExit struct {
	pid   int
	start uint64
	seen  time.Time
}

// exited records the exit of the exec'd process pid that started at start, seen by the shim at seen.
func (r *reapCheck) exited(pid int, start uint64, seen time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.noReap {
		r.exits = append(r.exits, treeExit{pid: pid, start: start, seen: seen})
	}
}

// reaps reports whether PID 1 is still taken to reap at now, zombie telling whether a recorded
// exit is still unreaped; learned is true for the call that finds out it does not.
func (r *reapCheck) reaps(now time.Time, zombie func(pid int, start uint64) bool) (reaps, learned bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.noReap {
		return false, false
	}
	kept := r.exits[:0]
	for _, e := range r.exits {
		if !zombie(e.pid, e.start) {
			continue // reaped
		}
		if now.Sub(e.seen) > reapGrace {
			return r.giveUp()
		}
		kept = append(kept, e)
	}
	r.exits = kept
	if len(kept) >= reapZombies {
		return r.giveUp()
	}
	return true, false
}

func (r *reapCheck) giveUp() (reaps, learned bool) {
	r.noReap, r.exits = true, nil
	return false, true
}

// gaveUp reports whether PID 1 was found not to reap.
func (r *reapCheck) gaveUp() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.noReap
}

// pid1Reaps reports whether c's execs may still be left to its PID 1, and says once when not.
func (c *container) pid1Reaps() bool {
	reaps, learned := c.reaping.reaps(time.Now(), runtime.IsZombie)
	if learned {
		log.L.WithField("container", c.id).Warn("PID 1 does not reap exited execs (they stay zombies): later execs run as the shim's children and a memory checkpoint is refused while one runs; run the container with an init that reaps (nerdctl run --init, tini) or a shell as PID 1")
	}
	return reaps
}
