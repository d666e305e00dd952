package pagechain

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// WaitReport waits until dir holds its ReportFile (the shim's deduplication of dir is done, or
// was not done), until the deadline or until ctx ends, and reports whether it is there. A reader
// that wants the directory in its final form (an export: the same checkpoint must make the same
// blob whenever exported) waits here rather than take a full dump the shim is about to rewrite.
// It is woken by the rename that puts the report in place (inotify), not by polling.
func WaitReport(ctx context.Context, dir string, deadline time.Time) (bool, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return false, fmt.Errorf("watch image directory %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO|unix.IN_CREATE|unix.IN_DELETE_SELF); err != nil {
		return false, fmt.Errorf("watch image directory %s: %w", dir, err)
	}
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		// Looked for after the watch is set: a report written before is seen here, one written
		// after wakes the poll.
		if _, err := os.Stat(filepath.Join(dir, ReportFile)); err == nil {
			return true, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return false, err
		}
		wait := time.Until(deadline)
		if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
			wait = time.Until(d)
		}
		if wait <= 0 || ctx.Err() != nil {
			return false, ctx.Err()
		}
		// At most a second a poll, so that a cancelled ctx is seen.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(min(wait, time.Second).Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			return false, fmt.Errorf("watch image directory %s: %w", dir, err)
		}
		// Drain the events: which one came does not matter, the Stat above decides.
		for {
			if _, err := unix.Read(fd, buf); err != nil {
				break
			}
		}
	}
}
