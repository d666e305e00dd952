package runtime

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// RestoreLimits bound a restore. A CRIU restore that cannot finish does not end by itself: on a
// page file shorter than its pagemap the restorer retried preadv for ever, writing ~17 MB/s of
// restore.log, and held the task in a state where nothing could be done to it.
type RestoreLimits struct {
	Timeout  time.Duration // 0: none
	LogLimit int64         // bytes of restore.log; 0: none
}

// watchPeriod is how often the watchdog looks at the clock, the context and the log.
const watchPeriod = 50 * time.Millisecond

// restoreWatchdog ends a restore that runs too long, writes too much log or whose context ends:
// it kills CRIU (the shim's criu children) and every process of the container's cgroup, where
// libcontainer moves CRIU before the restore and CRIU creates the restored tasks. libcontainer's
// Restore then fails and returns.
type restoreWatchdog struct {
	c     *Container
	log   string
	lim   RestoreLimits
	start time.Time
	done  chan struct{}
	wg    sync.WaitGroup

	mu    sync.Mutex
	cause error
}

func (c *Container) watchRestore(ctx context.Context, work string, lim RestoreLimits) *restoreWatchdog {
	w := &restoreWatchdog{c: c, log: filepath.Join(work, "restore.log"), lim: lim, start: time.Now(), done: make(chan struct{})}
	w.wg.Add(1)
	go w.run(ctx)
	return w
}

func (w *restoreWatchdog) run(ctx context.Context) {
	defer w.wg.Done()
	t := time.NewTicker(watchPeriod)
	defer t.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-ctx.Done():
			w.fire(fmt.Errorf("restore cancelled: %w", context.Cause(ctx)))
		case <-t.C:
			w.check()
		}
		if w.fired() {
			// Again on every tick until the restore returns: CRIU may not be in the cgroup yet.
			w.kill()
		}
	}
}

// check fires if the restore has passed its time or log limit.
func (w *restoreWatchdog) check() {
	if w.lim.Timeout > 0 && time.Since(w.start) > w.lim.Timeout {
		w.fire(fmt.Errorf("restore took longer than its limit of %s (restore_timeout): %w", w.lim.Timeout, context.DeadlineExceeded))
	}
	if w.lim.LogLimit > 0 {
		if fi, err := os.Stat(w.log); err == nil && fi.Size() > w.lim.LogLimit {
			// Cut what was written already: the log is kept next to the bundle.
			_ = os.Truncate(w.log, w.lim.LogLimit)
			w.fire(fmt.Errorf("CRIU's restore.log passed its limit of %d bytes (restore_log_limit_mib): %w", w.lim.LogLimit, errdefs.ErrResourceExhausted))
		}
	}
}

func (w *restoreWatchdog) fire(cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cause == nil {
		w.cause = cause
	}
}

func (w *restoreWatchdog) fired() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cause != nil
}

// kill kills the shim's criu children and the container's processes.
func (w *restoreWatchdog) kill() {
	for _, pid := range criuChildren() {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	// Processes reads the cgroup without libcontainer's lock, which the restore holds (so no
	// Status or Resume here: the restore's cgroup is not frozen anyway).
	if pids, err := w.c.lc.Processes(); err == nil {
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

// stop ends the watchdog and returns why it ended the restore, or nil. The limits are checked
// once more: a restore that finished past them between two looks fails all the same, so that a
// limit means the same whatever the timing.
func (w *restoreWatchdog) stop() error {
	close(w.done)
	w.wg.Wait()
	w.check()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cause
}

// criuChildren are the pids of this process's children named criu (libcontainer's criu swrk).
func criuChildren() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		open, close := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || close < open {
			continue
		}
		var ppid int
		var state byte
		if _, err := fmt.Sscanf(string(b[close+1:]), " %c %d", &state, &ppid); err != nil {
			continue
		}
		if ppid == self && string(b[open+1:close]) == "criu" {
			pids = append(pids, pid)
		}
	}
	return pids
}
