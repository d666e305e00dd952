package shim

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// reaper reaps zombie children of the shim that nobody waits for: processes re-parented to the
// shim because it is a child subreaper (daemonized grandchildren of a host-PID-namespace
// container, an exec's orphans). It must never reap a child someone else will wait for:
//   - container processes the shim collects through libcontainer's Process.Wait are owned
//     (own/disown) from the moment libcontainer hands back their pid;
//   - libcontainer's transient children (init stages, setns, criu swrk, hooks) are invisible to
//     the shim, so the reaper does not run at all while a libcontainer call that forks is in
//     flight (hold/release), and catches up when the last one returns.
type reaper struct {
	mu      sync.Mutex
	holds   int
	pending bool
	owned   map[int]struct{}
	catchUp sync.WaitGroup // the catch-ups after a last release, running in the background
}

func newReaper() *reaper {
	return &reaper{owned: make(map[int]struct{})}
}

// run reaps on every SIGCHLD until ctx ends. It must be started before the first container
// process so that no SIGCHLD is missed.
func (r *reaper) run(ctx context.Context) {
	ch := make(chan os.Signal, 32)
	signal.Notify(ch, unix.SIGCHLD)
	go func() {
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				r.reap()
			}
		}
	}()
}

// hold suspends reaping until the returned release is called. The last release catches up with
// the SIGCHLDs that came meanwhile in the background: a look at every thread's children and a
// wait for each (a millisecond or more on a loaded host) would otherwise delay the answer of the
// call that held it (a checkpoint's, a rollback's). A hold taken before that reap runs makes it
// stand aside again; one taken while it runs waits for it (the lock), so a child forked under
// a hold is never seen by it.
func (r *reaper) hold() (release func()) {
	r.mu.Lock()
	r.holds++
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			r.holds--
			catchUp := r.holds == 0 && r.pending
			r.mu.Unlock()
			if catchUp {
				r.catchUp.Go(r.reap)
			}
		})
	}
}

// own marks pid as waited for by someone else; disown hands it back.
func (r *reaper) own(pid int) {
	r.mu.Lock()
	r.owned[pid] = struct{}{}
	r.mu.Unlock()
}

func (r *reaper) disown(pid int) {
	r.mu.Lock()
	delete(r.owned, pid)
	r.mu.Unlock()
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.holds > 0 {
		r.pending = true
		return
	}
	r.pending = false
	for _, pid := range children() {
		if _, ok := r.owned[pid]; ok {
			continue
		}
		var ws unix.WaitStatus
		// A pid-specific wait reaps only that orphan; WNOHANG leaves a live one for the
		// SIGCHLD of its death.
		if reaped, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && reaped == pid {
			log.L.WithField("pid", pid).Debug("reaped orphan")
		}
	}
}

// children lists the shim's direct children from /proc/self/task/*/children: a child belongs
// to the thread that forked it, or to any thread once re-parented.
func children() []int {
	files, _ := filepath.Glob("/proc/self/task/*/children")
	var pids []int
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, field := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(field); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
