package podckpt

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestRecordListLookup(t *testing.T) {
	ns := t.TempDir()
	now := time.Now().UTC()
	for i, id := range []string{"a1b2c3000001", "a1b2c3000002", "ffee00000000"} {
		r := Record{ID: id, Pod: "default/p", Created: now.Add(time.Duration(-i) * time.Minute), Dir: Dir(ns, id),
			Members: []Member{{Name: "a", Container: "c1", Checkpoint: "ck" + id}}}
		if err := os.MkdirAll(r.Dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := Write(r); err != nil {
			t.Fatal(err)
		}
	}
	// A failed checkpoint's directory, with no record, and a container's image directory.
	for _, d := range []string{"pod-0123456789ab", "c1-20261128T000000.000"} {
		if err := os.MkdirAll(filepath.Join(ns, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	all, err := List(ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || all[0].ID != "ffee00000000" || all[2].ID != "a1b2c3000001" {
		t.Fatalf("List: %+v, want the 3 records oldest first", all)
	}
	if all[0].Dir != Dir(ns, "ffee00000000") || all[0].Checkpoints()[0] != "ckffee00000000" {
		t.Errorf("record read back: %+v", all[0])
	}
	for _, tc := range []struct {
		ref, want string
		check     func(error) bool
	}{
		{"a1b2c3000002", "a1b2c3000002", nil},
		{"ff", "ffee00000000", nil},
		{"a1b2", "", errdefs.IsInvalidArgument},
		{"99", "", errdefs.IsNotFound},
		{"", "", errdefs.IsNotFound},
	} {
		r, err := Lookup(all, tc.ref)
		switch {
		case tc.check != nil && !tc.check(err):
			t.Errorf("Lookup(%q): %v", tc.ref, err)
		case tc.check == nil && (err != nil || r.ID != tc.want):
			t.Errorf("Lookup(%q) = %s, %v; want %s", tc.ref, r.ID, err, tc.want)
		}
	}
}

func TestReadRefusesOtherFormat(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, RecordFile), []byte(`{"format": 9, "id": "x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir); !errdefs.IsNotImplemented(err) {
		t.Errorf("Read of format 9: %v", err)
	}
}
