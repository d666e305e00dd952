package capture

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

// Plan is what a capture will write: the result of walking a live upper and comparing it with
// the previous capture's record. Walk makes it while the writers are still (a frozen cgroup);
// Commit writes it.
type Plan struct {
	key, upper string
	base       string // the layer the capture goes on: the previous capture's, or key's parent
	ops        []op
	entries    map[string]entry // the new record
	stats      Stats
}

// Stats measure a plan: what the walk saw and what the capture writes.
type Stats struct {
	Delta     bool          // against the previous capture (else the whole upper)
	Entries   int           // entries of the upper walked
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

// Walk plans the capture of active snapshot key of sn: a delta against prev when prev recorded
// key's current upper and its layer still exists, else the whole upper on key's parent. The
// caller keeps the upper's writers still from Walk to Commit.
func Walk(ctx context.Context, sn snapshots.Snapshotter, key string, prev *Record) (*Plan, error) {
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
	upper, err := upperOf(key, ms)
	if err != nil {
		return nil, err
	}
	p := &Plan{key: key, upper: upper, base: info.Parent, entries: map[string]entry{}}
	var was map[string]entry
	if prev != nil && prev.Upper == upper {
		switch _, err := sn.Stat(ctx, prev.Layer); {
		case err == nil:
			p.base, was, p.stats.Delta = prev.Layer, prev.entries, true
		case !errdefs.IsNotFound(err):
			return nil, fmt.Errorf("capturing %s: previous capture %s: %w", key, prev.Layer, err)
		}
	}
	start := time.Now()
	if err := p.walk(was, start.Add(-racyWindow).UnixNano()); err != nil {
		return nil, fmt.Errorf("capturing %s: walk %s: %w", key, upper, err)
	}
	p.stats.Walk = time.Since(start)
	return p, nil
}

// Stats measure the plan.
func (p *Plan) Stats() Stats { return p.stats }

// Base is the layer the capture is stacked on ("" for none).
func (p *Plan) Base() string { return p.base }

// walk compares the upper with was (nil: write everything) into p's ops and new record.
func (p *Plan) walk(was map[string]entry, racyFrom int64) error {
	whole := map[string]bool{} // directories written whole: below them, everything is written
	err := filepath.WalkDir(p.upper, func(abs string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(p.upper, abs)
		if err != nil || rel == "." {
			return err
		}
		e, err := statEntry(abs, racyFrom)
		if err != nil {
			return err
		}
		p.entries[rel] = e
		p.stats.Entries++
		old, known := was[rel]
		switch {
		case under(whole, rel):
			p.write(rel, e, opaqueValue(e.opaque))
		case e.isDir() && (!known || e.recreated(old)):
			// Recreated where the previous capture had a directory: the upper need not mark
			// it opaque (nothing below the upper has it), the capture must.
			whole[rel] = true
			p.write(rel, e, opaqueValue(e.opaque || known && old.isDir()))
		case !known || e.changed(old):
			p.write(rel, e, "")
		}
		return nil
	})
	if err != nil {
		return err
	}
	p.whiteouts(was, whole)
	return nil
}

func (p *Plan) write(rel string, e entry, opaque string) {
	p.ops = append(p.ops, op{path: rel, opaque: opaque})
	p.stats.Writes++
	if e.isReg() {
		p.stats.Bytes += e.size
	}
}

// whiteouts hides the paths of the previous capture that are gone from the upper: one whiteout
// at the topmost gone path, none below a directory written whole or replaced by a non-directory.
func (p *Plan) whiteouts(was map[string]entry, whole map[string]bool) {
	var gone []string
	for rel := range was {
		if _, ok := p.entries[rel]; ok {
			continue
		}
		parent := filepath.Dir(rel)
		if pe, ok := p.entries[parent]; parent != "." && (!ok || !pe.isDir()) {
			continue
		}
		if !under(whole, rel) {
			gone = append(gone, rel)
		}
	}
	sort.Strings(gone)
	for _, rel := range gone {
		p.ops = append(p.ops, op{path: rel, whiteout: true})
	}
	p.stats.Whiteouts = len(gone)
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

// upperOf is the directory an active snapshot's mounts write to: the overlay's upperdir, or the
// bind-mounted directory of a snapshot without parent.
func upperOf(key string, ms []mount.Mount) (string, error) {
	if len(ms) == 1 {
		m := ms[0]
		switch m.Type {
		case "overlay":
			for _, o := range m.Options {
				if dir, ok := strings.CutPrefix(o, "upperdir="); ok {
					return dir, nil
				}
			}
		case "bind":
			return m.Source, nil
		}
	}
	return "", fmt.Errorf("snapshot %s is not an overlay with an upper directory (mounts %v): a checkpoint of a running task's filesystem needs one: %w", key, ms, errdefs.ErrNotImplemented)
}
