//go:build linux

package capture

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSavedRecord: a capture without a record in memory (a new process) compares with the record
// saved beside the upper, and captures the whole upper when that record is missing, unreadable or
// of another upper.
func TestSavedRecord(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, r *Record) // after the save
		delta bool
	}{
		{name: "saved", spoil: func(*testing.T, *Record) {}, delta: true},
		{name: "none", spoil: func(t *testing.T, r *Record) { must(t, os.Remove(recordPath(r.Upper))) }},
		{name: "unreadable", spoil: func(t *testing.T, r *Record) { must(t, os.WriteFile(recordPath(r.Upper), []byte("x"), 0o600)) }},
		{name: "another upper", spoil: func(t *testing.T, r *Record) {
			o := *r
			o.Upper = filepath.Join(filepath.Dir(r.Upper), "other") // saved at the same path
			must(t, o.Save())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			first := e.capture(nil, "cap1")
			age(first)
			must(t, first.Save())
			tc.spoil(t, first)
			write(t, e.live, "work/new", "n")
			p, _ := e.captureOf(nil, "cap2")
			if st := p.Stats(); st.Delta != tc.delta {
				t.Fatalf("capture on %q with stats %+v, want a delta on cap1: %t", p.Base(), st, tc.delta)
			}
			if tc.delta && p.Stats().Writes >= p.Stats().Entries {
				t.Fatalf("the delta writes %d of %d entries", p.Stats().Writes, p.Stats().Entries)
			}
			e.sameView(t, "cap2", tree(t, e.live))
		})
	}
}
