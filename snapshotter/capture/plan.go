package capture

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/snapshotter/freeze"
)

// Capture is one capture of an active snapshot's upper, in the steps a checkpoint needs: Open
// and Prepare (the snapshot calls, while the task runs; Estimate, to decide whether to capture
// at all), Walk and Write (while its writers are still: a frozen cgroup), Commit (the snapshot
// calls again, once written: it needs the writers no longer), or Abort (before or after Commit).
type Capture struct {
	key, upper string
	parent     string           // key's parent
	name, tmp  string           // the layer to commit, and the snapshot it is written into until then
	to         string           // the upper directory of tmp
	base       string           // the layer the capture goes on: the previous capture's, or key's parent
	prev       *Record          // the previous capture of the same upper, if any
	was        map[string]entry // what the capture compares with: prev's, if its layer is there
	ops        []op
	entries    map[string]entry // the new record
	stats      Stats
	maxEntries int   // a walk stops past this many entries (errTooMany); 0: no limit
	use        fsUse // the upper's filesystem's use once Write was done
	// live: the upper's writers run (Estimate), so an entry may go between its directory's read
	// and its own; the walk leaves it out.
	live bool
	// committed: Commit made the layer, which Abort then removes; removed: Abort removed it
	// (Commit and Prepare abort what they leave, and the caller may abort again).
	committed, removed bool
}

// Stats measure a capture: what the walk saw and what the capture writes.
type Stats struct {
	Delta     bool          // against the previous capture (else the whole upper)
	Entries   int           // entries of the upper walked
	Size      int64         // bytes of the upper's regular files
	Writes    int           // entries to write
	Bytes     int64         // bytes of regular files to write
	Whiteouts int           // paths of the previous capture gone since
	Walk      time.Duration // how long the walk took
}

// op is one path to write into the capture.
type op struct {
	path     string // relative to the upper
	whiteout bool   // a whiteout for a path gone since the previous capture
	opaque   string // for a directory: the value of its opaque mark, "" for none
}

// errTooMany ends a walk past its maxEntries.
var errTooMany = errors.New("too many entries")

// Open starts the capture of active snapshot key of sn as the layer name, after prev (nil: the
// record saved beside the upper, if any): it finds key's upper directory and parent, asking sn
// unless prev recorded them for the same key (a key keeps its upper for its life: the caller
// drops prev when it switches the key's upper). It makes no snapshot: Prepare does.
func Open(ctx context.Context, sn snapshots.Snapshotter, key, name string, prev *Record) (*Capture, error) {
	c := &Capture{key: key, name: name, tmp: "cklite/capturing/" + name, entries: map[string]entry{}}
	if prev != nil && prev.Key == key && prev.Upper != "" {
		c.upper, c.parent, c.prev = prev.Upper, prev.Parent, prev
		return c, nil
	}
	info, err := sn.Stat(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("capturing %s: %w", key, err)
	}
	if info.Kind != snapshots.KindActive {
		return nil, fmt.Errorf("capturing %s: it is a %s snapshot, only an active one has an upper to capture: %w", key, info.Kind, errdefs.ErrFailedPrecondition)
	}
	ms, err := sn.Mounts(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("capturing %s: %w", key, err)
	}
	if c.upper, err = freeze.UpperDir(key, ms); err != nil {
		return nil, err
	}
	c.parent = info.Parent
	if prev == nil {
		// A record saved by an earlier process (Record.Save); one that cannot be read is as
		// none: the capture is of the whole upper.
		prev, _ = loadRecord(c.upper)
	}
	if prev != nil && prev.Upper == c.upper {
		c.prev = prev
	}
	return c, nil
}

// Prepare prepares the snapshot "cklite/capturing/<name>" the capture is written into: on the
// previous capture's layer, the capture a delta against it, when that layer still exists, else
// on key's parent, the capture the whole upper. Call it under a lease (containerd's collector
// must not take it), and end with Commit or Abort. It touches nothing Estimate reads: the two may
// run at the same time.
func (c *Capture) Prepare(ctx context.Context, sn snapshots.Snapshotter) error {
	if c.prev != nil {
		ms, err := sn.Prepare(ctx, c.tmp, c.prev.Layer)
		switch {
		case err == nil:
			c.base, c.was, c.stats.Delta = c.prev.Layer, c.prev.entries, true
			return c.prepared(ctx, sn, ms)
		case !errdefs.IsNotFound(err):
			return fmt.Errorf("capturing %s: prepare %s on the previous capture %s: %w", c.key, c.tmp, c.prev.Layer, err)
		}
		// The previous capture's layer is gone (its checkpoint was removed): the whole upper.
	}
	ms, err := sn.Prepare(ctx, c.tmp, c.parent)
	if err != nil {
		return fmt.Errorf("capturing %s: prepare %s on %q: %w", c.key, c.tmp, c.parent, err)
	}
	c.base = c.parent
	return c.prepared(ctx, sn, ms)
}

func (c *Capture) prepared(ctx context.Context, sn snapshots.Snapshotter, ms []mount.Mount) error {
	var err error
	if c.to, err = freeze.UpperDir(c.tmp, ms); err != nil {
		_ = c.Abort(ctx, sn)
		return err
	}
	return nil
}

// Estimate walks the upper as Walk will, against the previous capture's record, but while its
// writers may still run, and stops once it has seen more than maxEntries entries (0: no limit):
// what the capture would cost if nothing changed until Walk, to decide before the task is
// frozen and dumped whether to capture at all. It assumes the previous capture's layer is still
// there (Prepare finds out).
func (c *Capture) Estimate(maxEntries int) (Stats, error) {
	e := &Capture{key: c.key, upper: c.upper, entries: map[string]entry{}, maxEntries: maxEntries, live: true}
	var was map[string]entry
	if c.prev != nil {
		was, e.stats.Delta = c.prev.entries, true
	}
	start := time.Now()
	err := e.walk(was, start.Add(-racyWindow).UnixNano())
	e.stats.Walk = time.Since(start)
	if err != nil && !errors.Is(err, errTooMany) {
		return Stats{}, fmt.Errorf("capturing %s: estimate from %s: %w", c.key, c.upper, err)
	}
	return e.stats, nil
}

// Walk compares the upper with the previous capture's record: what Write will write.
func (c *Capture) Walk() error {
	start := time.Now()
	if err := c.walk(c.was, start.Add(-racyWindow).UnixNano()); err != nil {
		return fmt.Errorf("capturing %s: walk %s: %w", c.key, c.upper, err)
	}
	c.stats.Walk = time.Since(start)
	return nil
}

// Stats measure the capture once walked.
func (c *Capture) Stats() Stats { return c.stats }

// Base is the layer the capture is stacked on ("" for none).
func (c *Capture) Base() string { return c.base }

// walk compares the upper with was (nil: write everything) into c's ops and new record.
func (c *Capture) walk(was map[string]entry, racyFrom int64) error {
	whole := map[string]bool{} // directories written whole: below them, everything is written
	err := filepath.WalkDir(c.upper, func(abs string, d fs.DirEntry, err error) error {
		if err != nil {
			return c.gone(abs, err)
		}
		rel, err := filepath.Rel(c.upper, abs)
		if err != nil || rel == "." {
			return err
		}
		if d.IsDir() && criuTemporary(rel) {
			return fs.SkipDir
		}
		e, err := statEntry(abs, racyFrom)
		if err != nil {
			return c.gone(abs, err)
		}
		c.entries[rel] = e
		c.stats.Entries++
		if c.maxEntries > 0 && c.stats.Entries > c.maxEntries {
			return errTooMany
		}
		if e.isReg() {
			c.stats.Size += e.size
		}
		old, known := was[rel]
		switch {
		case under(whole, rel):
			c.write(rel, e, opaqueValue(e.opaque))
		case e.isDir() && (!known || e.recreated(old)):
			// Recreated where the previous capture had a directory: the upper need not mark
			// it opaque (nothing below the upper has it), the capture must.
			whole[rel] = true
			c.write(rel, e, opaqueValue(e.opaque || known && old.isDir()))
		case !known || e.changed(old):
			c.write(rel, e, "")
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.whiteouts(was, whole)
	return nil
}

// criuTemporary tells whether directory rel of the upper is one CRIU makes in the task's mount
// namespace while it dumps a mount that has mounts below it (a tmpfs /dev): it bind-mounts the
// mount alone on "/tmp/cr-tmpfs.XXXXXX" (else "/cr-tmpfs.XXXXXX", mkdtemp's six characters) for a
// moment, then removes it (criu/mount.c, get_clean_mnt). A capture walks beside the dump: it can
// meet that directory, gone a moment later, or mounted over with the contents of /dev. It is
// never the task's, and never part of a checkpoint.
func criuTemporary(rel string) bool {
	const prefix = "cr-tmpfs."
	dir, name := filepath.Split(rel)
	return (dir == "" || dir == "tmp/") && len(name) == len(prefix)+6 && strings.HasPrefix(name, prefix)
}

// gone is the walk's error err at abs, or nil when the writers run (live) and abs, below the
// upper, went since its directory was read (a file renamed over another, a temporary removed):
// the walk goes on without it, as one after the freeze would.
func (c *Capture) gone(abs string, err error) error {
	if c.live && abs != c.upper && errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

func (c *Capture) write(rel string, e entry, opaque string) {
	c.ops = append(c.ops, op{path: rel, opaque: opaque})
	c.stats.Writes++
	if e.isReg() {
		c.stats.Bytes += e.size
	}
}

// whiteouts hides the paths of the previous capture that are gone from the upper: one whiteout
// at the topmost gone path, none below a directory written whole or replaced by a non-directory.
func (c *Capture) whiteouts(was map[string]entry, whole map[string]bool) {
	var gone []string
	for rel := range was {
		if _, ok := c.entries[rel]; ok {
			continue
		}
		parent := filepath.Dir(rel)
		if pe, ok := c.entries[parent]; parent != "." && (!ok || !pe.isDir()) {
			continue
		}
		if !under(whole, rel) {
			gone = append(gone, rel)
		}
	}
	sort.Strings(gone)
	for _, rel := range gone {
		c.ops = append(c.ops, op{path: rel, whiteout: true})
	}
	c.stats.Whiteouts = len(gone)
}

// under tells whether rel is below one of dirs.
func under(dirs map[string]bool, rel string) bool {
	for d := filepath.Dir(rel); d != "."; d = filepath.Dir(d) {
		if dirs[d] {
			return true
		}
	}
	return false
}

func opaqueValue(opaque bool) string {
	if opaque {
		return "y"
	}
	return ""
}
