//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/log"
)

// Deep chains. overlayfs takes at most 500 lower layers, and containerd's mount helper a page of
// options; a sandbox frozen after every step of an agent passes both. So every fanOut layers of
// a chain are also kept merged into one directory, and fanOut merges of one level into one of the
// next: a layer at depth d (counted from the bottom of its chain, 1-based) tops a merge of c
// layers whenever c is a power of fanOut and d is a multiple of c. A mount then takes, from the
// top, its newest layers one by one and the rest as the largest merges: at most fanOut-1 entries a
// level, e.g. 39 lower directories for 1000 freezes with the default fan-out of 32.
//
// A merge holds hard links to the layers' files, so it costs O(entries), not O(bytes), and it is
// built in the background after the layer that completes it is first used as a parent. Until it
// exists mounts use the single layers. What a merge contains is exactly what overlayfs shows
// for its layers stacked (see applyLayer), so switching a chain to it changes nothing a snapshot
// sees. A merge is named after its top layer and size, "m<id>-<count>", next to the snapshot
// directories; it is built under a temporary name and renamed, so a crash leaves either nothing
// or a complete merge. It is removed with its top layer.

// mergingPrefix names the directory of a merge being built.
const mergingPrefix = "merging-"

// DefaultFanOut is the number of layers (or merges) one merge covers.
const DefaultFanOut = 32

// maxLowerDirs bounds a mount's lower layers before Mounts waits for the merges it needs rather
// than use them when ready: far under overlayfs's 500 and small enough for containerd's mount
// helper to fit the option string into a page.
const maxLowerDirs = 128

type mergeSet struct {
	dir    string // the snapshots directory
	fanOut int

	mu      sync.Mutex
	known   map[string]map[int]bool // top layer id -> sizes of the merges it tops
	pending map[string]bool         // merge names queued for the worker

	build   sync.Mutex // one merge is built at a time, by the worker or by a waiting Mounts
	jobs    chan mergeJob
	done    chan struct{}
	closed  sync.Once
	working sync.WaitGroup
}

// mergeJob is one merge to build: the ids of the layers it covers, top first.
type mergeJob []string

func newMergeSet(dir string, fanOut int) *mergeSet {
	m := &mergeSet{
		dir:     dir,
		fanOut:  fanOut,
		known:   map[string]map[int]bool{},
		pending: map[string]bool{},
		jobs:    make(chan mergeJob, 1024),
		done:    make(chan struct{}),
	}
	m.working.Add(1)
	go m.work()
	return m
}

func mergeName(top string, count int) string {
	return fmt.Sprintf("m%s-%d", top, count)
}

// parseMergeName reports whether name is a merge directory's and which layer tops it.
func parseMergeName(name string) (top string, count int, ok bool) {
	rest, found := strings.CutPrefix(name, "m")
	if !found {
		return "", 0, false
	}
	top, n, found := strings.Cut(rest, "-")
	if !found {
		return "", 0, false
	}
	if _, err := strconv.ParseUint(top, 10, 64); err != nil {
		return "", 0, false
	}
	count, err := strconv.Atoi(n)
	if err != nil || count < 2 {
		return "", 0, false
	}
	return top, count, true
}

// load indexes the merges on disk; Cleanup has already removed those whose top layer is gone.
func (m *mergeSet) load() error {
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range entries {
		if top, count, ok := parseMergeName(e.Name()); ok {
			m.addLocked(top, count)
		}
	}
	return nil
}

func (m *mergeSet) addLocked(top string, count int) {
	if m.known[top] == nil {
		m.known[top] = map[int]bool{}
	}
	m.known[top][count] = true
}

func (m *mergeSet) has(top string, count int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.known[top][count]
}

// forget drops a directory about to be removed from the index, if it is a merge.
func (m *mergeSet) forget(name string) {
	if top, count, ok := parseMergeName(name); ok {
		m.mu.Lock()
		delete(m.known[top], count)
		m.mu.Unlock()
	}
}

func (m *mergeSet) layerPath(id string) string {
	return filepath.Join(m.dir, id, "fs")
}

func (m *mergeSet) mergePath(top string, count int) string {
	return filepath.Join(m.dir, mergeName(top, count), "fs")
}

// lowerDirs returns the lower directories, top first, for a snapshot on the chain of layer ids
// parents (top first), and queues the merges the chain is due. When the chain would still need
// more than maxLowerDirs directories it builds the missing merges before returning.
func (m *mergeSet) lowerDirs(ctx context.Context, parents []string) ([]string, error) {
	due := m.due(parents)
	dirs := m.plan(parents)
	if len(dirs) <= maxLowerDirs {
		for _, job := range due {
			m.enqueue(job)
		}
		return dirs, nil
	}
	log.G(ctx).WithField("layers", len(parents)).Debug("waiting for merges of a deep chain")
	for _, job := range due {
		if err := m.ensure(job); err != nil {
			return nil, err
		}
	}
	return m.plan(parents), nil
}

// plan takes, from the top, the largest merge each position tops, or the single layer.
func (m *mergeSet) plan(parents []string) []string {
	var dirs []string
	for i := 0; i < len(parents); {
		depth := len(parents) - i
		step := 1
		for c := m.largestSize(depth); c > 1; c /= m.fanOut {
			if depth%c == 0 && m.has(parents[i], c) {
				step = c
				break
			}
		}
		if step == 1 {
			dirs = append(dirs, m.layerPath(parents[i]))
		} else {
			dirs = append(dirs, m.mergePath(parents[i], step))
		}
		i += step
	}
	return dirs
}

// largestSize is the largest merge size not above depth.
func (m *mergeSet) largestSize(depth int) int {
	c := 1
	for c*m.fanOut <= depth {
		c *= m.fanOut
	}
	return c
}

// due lists the merges the chain should have and does not, smallest first so that each one's
// parts are built before it.
func (m *mergeSet) due(parents []string) []mergeJob {
	var jobs []mergeJob
	for c := m.fanOut; c <= len(parents); c *= m.fanOut {
		for i := len(parents) - c; i >= 0; i -= c {
			// i is where a layer at a depth that is a multiple of c sits.
			if !m.has(parents[i], c) {
				jobs = append(jobs, mergeJob(parents[i:i+c]))
			}
		}
	}
	return jobs
}

func (m *mergeSet) enqueue(job mergeJob) {
	name := mergeName(job[0], len(job))
	m.mu.Lock()
	if m.pending[name] {
		m.mu.Unlock()
		return
	}
	m.pending[name] = true
	m.mu.Unlock()
	select {
	case m.jobs <- job:
	default:
		// A full queue only delays a merge: the next mount of the chain asks again.
		m.mu.Lock()
		delete(m.pending, name)
		m.mu.Unlock()
	}
}

func (m *mergeSet) work() {
	defer m.working.Done()
	for {
		select {
		case <-m.done:
			return
		case job := <-m.jobs:
			if err := m.ensure(job); err != nil {
				log.L.WithError(err).WithField("merge", mergeName(job[0], len(job))).Warn("merging layers failed; mounts keep using the single layers")
			}
			m.mu.Lock()
			delete(m.pending, mergeName(job[0], len(job)))
			m.mu.Unlock()
		}
	}
}

// close stops the worker, after the merge it may be building.
func (m *mergeSet) close() {
	m.closed.Do(func() { close(m.done) })
	m.working.Wait()
}

// isMergeInProgress reports whether name is the temporary directory of a merge being built: Cleanup
// must leave those alone while the snapshotter runs.
func isMergeInProgress(name string) bool {
	return strings.HasPrefix(name, mergingPrefix)
}

// ensure builds the merge of the layers in job (top first), and first the smaller merges it is
// made of.
func (m *mergeSet) ensure(job mergeJob) error {
	count := len(job)
	if m.has(job[0], count) {
		return nil
	}
	var sources []string // bottom first
	if count == m.fanOut {
		for i := count - 1; i >= 0; i-- {
			// A layer whose upper is still borrowed is read where it is (lend.go).
			layer, _ := realUpper(m.layerPath(job[i]))
			sources = append(sources, layer)
		}
	} else {
		part := count / m.fanOut
		for i := count - part; i >= 0; i -= part {
			if err := m.ensure(job[i : i+part]); err != nil {
				return err
			}
			sources = append(sources, m.mergePath(job[i], part))
		}
	}

	m.build.Lock()
	defer m.build.Unlock()
	if m.has(job[0], count) {
		return nil
	}
	tmp, err := os.MkdirTemp(m.dir, mergingPrefix)
	if err != nil {
		return fmt.Errorf("merging layers: %w", err)
	}
	if err := m.merge(filepath.Join(tmp, "fs"), sources); err != nil {
		return errors.Join(err, os.RemoveAll(tmp))
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, mergeName(job[0], count))); err != nil {
		return errors.Join(fmt.Errorf("merging layers: %w", err), os.RemoveAll(tmp))
	}
	m.mu.Lock()
	m.addLocked(job[0], count)
	m.mu.Unlock()
	return nil
}

// merge stacks the sources, bottom first, into the new directory dst.
func (m *mergeSet) merge(dst string, sources []string) error {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	for _, src := range sources {
		if err := applyLayer(src, dst); err != nil {
			return fmt.Errorf("merging %s: %w", src, err)
		}
	}
	return nil
}
