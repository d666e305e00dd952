package pagechain

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The materialisation cache: the copies of image directories that restores read (materialise.go),
// one directory each, named by cacheKey, in CacheRoot. A copy is made in a temporary directory
// and renamed into place, so that a copy is whole or absent, and two processes making the same
// copy keep one. A restore holds the copies it reads locked shared; eviction takes a copy's lock
// exclusively, without waiting, before it removes it. A process looks for copies to evict at most
// every evictEvery, in the background after a restore that made a copy.

// CacheRoot is the cache's directory. The shim mounts a tmpfs of its own there (runtime's
// PrepareCRIU): a symbolic link costs 150-200 µs on the disk's filesystem here, and a chain of 9
// levels has some 360 of them. Not /dev/shm, a tmpfs too: any user may make the cache's
// directory there first, to fail every restore of a compressed checkpoint, or to have it read
// pages of theirs.
var CacheRoot = "/run/cklite/pages"

// cacheMax bounds the bytes of decompressed pages the cache keeps (a tree search of 101
// checkpoints of a small agent: some 30 MiB); cacheIdle is how long a copy no restore used is
// kept.
var cacheMax int64 = 256 << 20

const cacheIdle = 10 * time.Minute

// cacheDir is the cache's directory, made if need be. It must be a directory of this user's, of
// mode 0700: the copies say which pages a restore reads.
func cacheDir() (string, error) {
	dir := CacheRoot
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return "", err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != uint32(os.Getuid()) || st.Mode&0o077 != 0 {
		return "", fmt.Errorf("materialisation cache %s: not a private directory of this user's", dir)
	}
	return dir, nil
}

// useCopy returns copy name of src (parent link parent) locked shared, made first if it is not
// there; made says whether this call made it.
func useCopy(root, name, src, parent string) (f *os.File, made bool, err error) {
	dir := filepath.Join(root, name)
	for range 3 {
		if f, err = lockCopy(dir, unix.LOCK_SH); err == nil {
			now := time.Now()
			os.Chtimes(dir, now, now) // used: evicted last
			return f, made, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, false, err
		}
		if err = makeCopy(root, dir, src, parent); err != nil {
			return nil, false, err
		}
		made = true
	}
	return nil, false, fmt.Errorf("copy %s of %s: removed as fast as it is made", dir, src)
}

// makeCopy makes copy dir of src in a temporary directory of root and renames it into place; a
// copy another process put there first is kept.
func makeCopy(root, dir, src, parent string) error {
	tmp, err := os.MkdirTemp(root, ".tmp-")
	if err != nil {
		return err
	}
	if err := materialiseDir(src, tmp, parent); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	// The links are relative to where the copy ends: dir is tmp's sibling.
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if errors.Is(err, os.ErrExist) || errors.Is(err, unix.ENOTEMPTY) {
			return nil
		}
		return err
	}
	return nil
}

// evictEvery is how often a process looks for copies to evict: a look reads every copy's
// directory (some 100 in a tree search, 4000 entries), which would cost a rollback that made a
// copy several ms each time.
const evictEvery = 30 * time.Second

var lastEvict struct {
	sync.Mutex
	at time.Time
}

// maybeEvict evicts, unless this process did less than evictEvery ago.
func maybeEvict(root string) {
	lastEvict.Lock()
	due := time.Since(lastEvict.at) >= evictEvery
	if due {
		lastEvict.at = time.Now()
	}
	lastEvict.Unlock()
	if due {
		evict(root)
	}
}

// evict removes the copies unused for cacheIdle, and the least recently used ones while the
// cache holds more than cacheMax bytes; never a copy a restore holds; and what a killed process
// left of a copy it was making.
func evict(root string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	type cached struct {
		dir  string
		used time.Time
		size int64
	}
	var all []cached
	var total int64
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if strings.HasPrefix(e.Name(), ".tmp-") {
			if time.Since(info.ModTime()) > cacheIdle {
				os.RemoveAll(dir)
			}
			continue
		}
		c := cached{dir: dir, used: info.ModTime(), size: copySize(dir)}
		all = append(all, c)
		total += c.size
	}
	slices.SortFunc(all, func(a, b cached) int { return a.used.Compare(b.used) })
	for _, c := range all {
		if total <= cacheMax && time.Since(c.used) < cacheIdle {
			break
		}
		f, err := lockCopy(c.dir, unix.LOCK_EX|unix.LOCK_NB)
		if err != nil {
			continue // in use, or gone
		}
		// Renamed first: a removal cut short leaves no partial copy under a copy's name.
		gone := filepath.Join(root, ".tmp-evicted-"+filepath.Base(c.dir))
		if os.Rename(c.dir, gone) == nil {
			total -= c.size
			os.RemoveAll(gone)
		}
		f.Close()
	}
}

// copySize is the bytes of the regular files (decompressed pages) of copy dir.
func copySize(dir string) int64 {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range entries {
		if e.Type().IsRegular() {
			if info, err := e.Info(); err == nil {
				n += info.Size()
			}
		}
	}
	return n
}
