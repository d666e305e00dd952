//go:build linux

package snapshotter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// Dedup. Committed layers never change, so identical files in them (the same package installed
// in fifty forks of one sandbox, a file copied up unchanged) can be one inode. The store keeps a
// hard link per distinct file under the hash of its content AND its metadata (mode, owner, times,
// xattrs): a hard link shares all of these, so only files that already agree in every visible
// attribute are joined, and what a snapshot sees stays the same apart from inode numbers and
// link counts.
//
// A layer is deduplicated in the background after its Commit. A file is swapped for the stored
// inode with one rename (the link is made in the store's tmp directory first, so a crash never
// leaves a stray name inside a layer). A layer may already be a lower layer of a mount then;
// overlayfs keeps serving the inode it has looked up, whose content is the same. Prune drops
// store entries no layer links any more.

// minDedupSize skips files too small to save a block.
const minDedupSize = 4096

type dedupStore struct {
	dir   string
	queue chan string
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once

	pending sync.WaitGroup // layers queued and not yet done
}

// openDedupStore opens the store in dir, dropping the links a killed run left in its tmp.
func openDedupStore(dir string) (*dedupStore, error) {
	if err := os.RemoveAll(filepath.Join(dir, "tmp")); err != nil {
		return nil, fmt.Errorf("dedup store: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o700); err != nil {
		return nil, fmt.Errorf("dedup store: %w", err)
	}
	d := &dedupStore{dir: dir, queue: make(chan string, 4096), done: make(chan struct{})}
	d.wg.Add(1)
	go d.work()
	return d, nil
}

func (d *dedupStore) enqueue(layer string) {
	d.pending.Add(1)
	select {
	case d.queue <- layer:
	default:
		d.pending.Done()
		log.L.WithField("layer", layer).Warn("dedup queue full: layer left as it is")
	}
}

func (d *dedupStore) work() {
	defer d.wg.Done()
	for {
		select {
		case <-d.done:
			return
		case layer := <-d.queue:
			if err := d.layer(layer); err != nil && !errors.Is(err, fs.ErrNotExist) {
				log.L.WithError(err).WithField("layer", layer).Warn("dedup of a committed layer failed; it keeps its own copies")
			}
			d.pending.Done()
		}
	}
}

// wait blocks until every queued layer has been deduplicated (for tests and benchmarks).
func (d *dedupStore) wait() {
	d.pending.Wait()
}

func (d *dedupStore) close() {
	d.once.Do(func() { close(d.done) })
	d.wg.Wait()
}

// layer joins every regular file of layer with its stored twin, or stores it.
func (d *dedupStore) layer(layer string) error {
	return filepath.WalkDir(layer, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		select {
		case <-d.done:
			return filepath.SkipAll
		default:
		}
		return d.file(path)
	})
}

func (d *dedupStore) file(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return err
	}
	if st.Size < minDedupSize {
		return nil
	}
	key, err := fileKey(path, &st)
	if err != nil {
		return err
	}
	stored := filepath.Join(d.dir, key[:2], key)
	var sst unix.Stat_t
	switch err := unix.Lstat(stored, &sst); {
	case errors.Is(err, unix.ENOENT):
		if err := os.MkdirAll(filepath.Dir(stored), 0o700); err != nil {
			return err
		}
		if err := os.Link(path, stored); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		return nil
	case err != nil:
		return &os.PathError{Op: "lstat", Path: stored, Err: err}
	case sst.Ino == st.Ino && sst.Dev == st.Dev:
		return nil
	}
	tmp := filepath.Join(d.dir, "tmp", key)
	_ = os.Remove(tmp)
	if err := os.Link(stored, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return nil
}

// fileKey hashes a file's content with every attribute a hard link would share.
func fileKey(path string, st *unix.Stat_t) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "mode=%o uid=%d gid=%d size=%d mtime=%d.%d\n", st.Mode, st.Uid, st.Gid, st.Size, st.Mtim.Sec, st.Mtim.Nsec)
	names, err := listXattrs(path)
	if err != nil {
		return "", err
	}
	sort.Strings(names)
	for _, name := range names {
		value, err := getXattr(path, name)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "xattr %q=%x\n", name, value)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// prune removes stored files no layer links any more.
func (d *dedupStore) prune(ctx context.Context) error {
	tmp := filepath.Join(d.dir, "tmp")
	return filepath.WalkDir(d.dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || path == tmp {
			if err == nil {
				err = filepath.SkipDir // swaps in flight
			}
			return err
		}
		if !e.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return nil // removed meanwhile
		}
		if st.Nlink == 1 {
			if err := os.Remove(path); err != nil {
				log.G(ctx).WithError(err).WithField("path", path).Warn("failed to prune dedup store")
			}
		}
		return nil
	})
}
