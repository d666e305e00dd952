package capture

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// racyWindow is how close to a capture's start a change must be for the next capture to write
// the entry again whatever its times say: more than two ticks of the kernel's coarse clock
// (4 ms at HZ=250, 10 ms at HZ=100), which timestamps changes.
const racyWindow = 50 * time.Millisecond

// opaqueXattr marks an overlay directory that hides the layers below it.
const opaqueXattr = "trusted.overlay.opaque"

// Record is what one capture saw in the upper directory it captured: every path, relative to the
// upper, with the attributes that tell whether it changed since. The next capture of the same
// upper writes only what differs.
type Record struct {
	Key     string            // the active snapshot captured
	Parent  string            // Key's parent
	Upper   string            // the upper directory captured, Key's
	Layer   string            // the committed layer that holds the capture
	Labels  map[string]string // Layer's labels, as committed
	Size    int64             // bytes of the upper's regular files
	use     fsUse             // the upper's filesystem's use once the capture was written
	entries map[string]entry
}

// Len is the number of entries the capture saw in the upper.
func (r *Record) Len() int {
	if r == nil {
		return 0
	}
	return len(r.entries)
}

// entry is one path of a Record.
type entry struct {
	ino                 uint64
	btime, ctime, mtime int64 // nanoseconds; btime 0 where the filesystem has none
	size                int64
	mode                uint32 // type and permission bits
	nlink               uint32
	opaque              bool // a directory the upper marks opaque
	racy                bool // changed too close to the capture for its times to tell the next change
}

func (e entry) isDir() bool { return e.mode&unix.S_IFMT == unix.S_IFDIR }

func (e entry) isReg() bool { return e.mode&unix.S_IFMT == unix.S_IFREG }

// changed tells whether e, seen now, may differ from was, seen by the previous capture.
func (e entry) changed(was entry) bool {
	return was.racy || e.ino != was.ino || e.btime != was.btime || e.ctime != was.ctime ||
		e.mtime != was.mtime || e.size != was.size || e.mode != was.mode
}

// recreated tells whether directory e is not the directory was, or hides what was below it
// since: its content in the previous capture must not show through.
func (e entry) recreated(was entry) bool {
	if !was.isDir() {
		return true
	}
	if e.opaque {
		return !was.opaque || was.racy || e.ino != was.ino || e.btime != was.btime
	}
	// A directory the upper does not mark opaque merges with the layers below the upper: if
	// its identity cannot be told (racy), write what changed entry by entry instead.
	return !was.racy && (e.ino != was.ino || e.btime != was.btime)
}

// statEntry reads path's entry; racyFrom is the time from which a change counts as racy.
func statEntry(path string, racyFrom int64) (entry, error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC,
		unix.STATX_BASIC_STATS|unix.STATX_BTIME, &st); err != nil {
		return entry{}, fmt.Errorf("stat %s: %w", path, err)
	}
	e := entry{
		ino:   st.Ino,
		ctime: nanos(st.Ctime),
		mtime: nanos(st.Mtime),
		size:  int64(st.Size),
		mode:  uint32(st.Mode),
		nlink: st.Nlink,
	}
	if st.Mask&unix.STATX_BTIME != 0 {
		e.btime = nanos(st.Btime)
	}
	e.racy = e.ctime >= racyFrom
	if e.isDir() {
		var err error
		if e.opaque, err = isOpaque(path); err != nil {
			return entry{}, err
		}
	}
	return e, nil
}

func nanos(t unix.StatxTimestamp) int64 { return t.Sec*int64(time.Second) + int64(t.Nsec) }

// isOpaque tells whether directory path carries overlayfs's opaque mark.
func isOpaque(path string) (bool, error) {
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(path, opaqueXattr, buf)
	switch {
	case errors.Is(err, unix.ENODATA):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read %s of %s: %w", opaqueXattr, path, err)
	}
	return n == 1 && buf[0] == 'y', nil
}
