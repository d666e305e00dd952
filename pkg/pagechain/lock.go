package pagechain

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/criuimage"
)

// Locked is a chain of image directories held locked: Dirs[0] the directory asked for, then its
// parents, nearest first. While it is held, no directory of the chain changes its pages, pagemaps
// or parent link.
type Locked struct {
	Dirs  []string
	files []*os.File
}

// Unlock releases the chain's locks.
func (l *Locked) Unlock() {
	for _, f := range l.files {
		f.Close()
	}
	l.files = nil
}

// ReadLock takes a shared lock on dir and on each of its parents, child first: what a restore
// holds while CRIU reads the chain, and what a reader of pages holds.
func ReadLock(dir string) (*Locked, error) {
	return lockChain(dir, unix.LOCK_SH)
}

// writeLock takes an exclusive lock on dir and shared locks on its parents.
func writeLock(dir string) (*Locked, error) {
	return lockChain(dir, unix.LOCK_EX)
}

// lockChain locks dir (how) and then, following each parent link once the directory that holds it
// is locked (so the link cannot change meanwhile), its parents (shared). Locks are always taken
// child first, so two chains never wait on each other in a cycle.
func lockChain(dir string, how int) (*Locked, error) {
	l := &Locked{}
	for cur := dir; ; {
		f, err := lockDir(cur, how)
		if err != nil {
			l.Unlock()
			return nil, err
		}
		l.files = append(l.files, f)
		l.Dirs = append(l.Dirs, cur)
		how = unix.LOCK_SH
		next, err := parentOf(cur)
		if err != nil || next == "" {
			if err != nil {
				l.Unlock()
			}
			return l, err
		}
		if len(l.Dirs) > criuimage.MaxChain {
			l.Unlock()
			return nil, fmt.Errorf("image directory %s: more than %d parent image directories (a loop?)", dir, criuimage.MaxChain)
		}
		cur = next
	}
}

// lockDir flocks the directory itself: nothing is created in it for the lock. O_DIRECTORY: a link
// to anything else (a FIFO would block the open) fails at once.
func lockDir(dir string, how int) (*os.File, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("lock image directory: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock image directory %s: %w", dir, err)
	}
	return f, nil
}

// parentOf is the directory dir's parent link names, resolved from dir, or "" without a link.
func parentOf(dir string) (string, error) {
	target, err := os.Readlink(filepath.Join(dir, criuimage.ParentLink))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("parent of image directory %s: %w", dir, err)
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(dir, target)
	}
	return filepath.Clean(target), nil
}
