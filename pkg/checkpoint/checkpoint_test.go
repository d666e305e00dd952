package checkpoint

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
)

func sample() Meta {
	return Meta{
		ID: "0123456789ab", Namespace: "default", Container: "c1", Contents: MemoryAndFS,
		Snapshotter: "cklite", Frozen: FrozenName("0123456789ab"), Parent: "ba9876543210",
		Host: "host", Created: time.Date(2026, 11, 21, 4, 0, 0, 123, time.UTC), MemoryBytes: 4096, Version: "test",
		Name: "step-1", Labels: map[string]string{"run": "7"},
	}
}

func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	want := sample()
	if err := Write(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	want.Format = FormatVersion
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read %+v, wrote %+v", got, want)
	}
}

func TestReadBadInput(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string // "" means no file
		isErr   func(error) bool
		says    string
	}{
		{"no metadata file", "", errdefs.IsNotFound, "not a cklite checkpoint"},
		{"truncated", `{"format":1,"id":"x`, errdefs.IsInvalidArgument, "corrupt"},
		{"other format", `{"format":2,"id":"x","contents":"memory"}`, errdefs.IsInvalidArgument, "format 2"},
		{"no id", `{"format":1,"contents":"memory"}`, errdefs.IsInvalidArgument, "no id"},
		{"unknown contents", `{"format":1,"id":"x","contents":"disk"}`, errdefs.IsInvalidArgument, `contents "disk"`},
		{"fs without a frozen layer", `{"format":1,"id":"x","contents":"memory+fs"}`, errdefs.IsInvalidArgument, "no frozen layer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.content != "" {
				if err := os.WriteFile(filepath.Join(dir, MetaFile), []byte(tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			_, err := Read(dir)
			if err == nil || !tc.isErr(err) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Read = %v, want an error saying %q", err, tc.says)
			}
		})
	}
}

func TestParseContents(t *testing.T) {
	for in, want := range map[string]Contents{"": MemoryAndFS, "memory+fs": MemoryAndFS, "fs": FSOnly, "memory": MemoryOnly} {
		if got, err := ParseContents(in); err != nil || got != want {
			t.Errorf("ParseContents(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseContents("all"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("ParseContents(all) = %v, want invalid argument", err)
	}
}

// TestLeaseLabelsRoundTrip: what ls shows from a lease is what the shim recorded.
func TestLeaseLabelsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Record)
	}{
		{"full", func(r *Record) {
			r.ImagePath = "/var/lib/nerdctl/checkpoints/x"
			r.Expires = time.Date(2026, 11, 21, 5, 0, 0, 0, time.UTC)
		}},
		{"memory only, no parent", func(r *Record) { r.Contents, r.Frozen, r.Snapshotter, r.Parent = MemoryOnly, "", "", "" }},
		{"no host, no version", func(r *Record) { r.Host, r.Version = "", "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := Record{Meta: sample()}
			tc.edit(&want)
			got, err := FromLease(want.Namespace, leases.Lease{ID: LeaseID(want.ID), Labels: want.labels()})
			if err != nil {
				t.Fatal(err)
			}
			want.Format = FormatVersion
			if !got.Expires.Equal(want.Expires) {
				t.Fatalf("expires %v, want %v", got.Expires, want.Expires)
			}
			got.Expires, want.Expires = time.Time{}, time.Time{}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("from lease %+v\nwant %+v", got, want)
			}
		})
	}
	if _, err := FromLease("default", leases.Lease{ID: "other", Labels: map[string]string{LabelID: "x"}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a lease named unlike its checkpoint: %v", err)
	}
}
