package capture

import (
	"encoding/gob"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// A Record lives in the memory of the process that captures (the shim of the container), and is
// also saved beside the upper it describes (in the snapshot's directory, outside the upper
// itself, so it goes when the snapshot goes and is never part of a layer's contents): a new shim
// for the same rootfs (a task stopped and started again, a restarted shim) then captures what
// changed since the last capture saved instead of the whole upper. A saved record only has to be
// the record of some capture of this upper whose layer may still exist: one older than the last
// capture (a save lost or overtaken) is still exactly what its own layer holds, so a delta
// against it, stacked on its layer, shows the live view; a layer removed since is found by
// Prepare. Nothing is synced: a record lost costs one whole capture.

// recordFile is the name of the saved record in an upper's snapshot directory.
const recordFile = "cklite-capture.gob"

// recordVersion changes whenever savedRecord does: an older file is ignored.
const recordVersion = 1

type savedRecord struct {
	Version      int
	Upper, Layer string
	Labels       map[string]string
	Size         int64
	Use          fsUse
	Entries      map[string]savedEntry
}

type savedEntry struct {
	Ino                 uint64
	Btime, Ctime, Mtime int64
	Size                int64
	Mode, Nlink         uint32
	Opaque, Racy        bool
}

// recordPath is where the record of upper is saved.
func recordPath(upper string) string { return filepath.Join(filepath.Dir(upper), recordFile) }

// Save saves r beside its upper (written aside and renamed into place), for a later Open without
// a record in memory.
func (r *Record) Save() error {
	s := savedRecord{Version: recordVersion, Upper: r.Upper, Layer: r.Layer, Labels: r.Labels, Size: r.Size, Use: r.use, Entries: make(map[string]savedEntry, len(r.entries))}
	for p, e := range r.entries {
		s.Entries[p] = savedEntry{Ino: e.ino, Btime: e.btime, Ctime: e.ctime, Mtime: e.mtime, Size: e.size, Mode: e.mode, Nlink: e.nlink, Opaque: e.opaque, Racy: e.racy}
	}
	path := recordPath(r.Upper)
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("save the capture record of %s: %w", r.Upper, err)
	}
	err = gob.NewEncoder(f).Encode(&s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save the capture record of %s: %w", r.Upper, err)
	}
	return nil
}

// loadRecord loads the record saved beside upper; nil, nil when there is none.
func loadRecord(upper string) (*Record, error) {
	f, err := os.Open(recordPath(upper))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var s savedRecord
	if err := gob.NewDecoder(f).Decode(&s); err != nil {
		return nil, fmt.Errorf("capture record of %s: %w", upper, err)
	}
	if s.Version != recordVersion || s.Upper != upper {
		return nil, nil
	}
	r := &Record{Upper: s.Upper, Layer: s.Layer, Labels: s.Labels, Size: s.Size, use: s.Use, entries: make(map[string]entry, len(s.Entries))}
	for p, e := range s.Entries {
		r.entries[p] = entry{ino: e.Ino, btime: e.Btime, ctime: e.Ctime, mtime: e.Mtime, size: e.Size, mode: e.Mode, nlink: e.Nlink, opaque: e.Opaque, racy: e.Racy}
	}
	return r, nil
}
