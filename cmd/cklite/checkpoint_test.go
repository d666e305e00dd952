package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/cklite/cklite/pkg/checkpoint"
	ckclient "github.com/cklite/cklite/pkg/client"
)

var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func record(id, parent string, contents checkpoint.Contents, age time.Duration) checkpoint.Record {
	return checkpoint.Record{Meta: checkpoint.Meta{
		ID: id, Container: "web", Parent: parent, Contents: contents, Created: now.Add(-age), MemoryBytes: 4_200_000,
	}}
}

// TestSizeColumns checks ls's FILES (fsSize) and STORED (memStored) cells.
func TestSizeColumns(t *testing.T) {
	stored := int64(12_000)
	for _, tc := range []struct {
		name   string
		column func(ckclient.Checkpoint) string
		view   ckclient.Checkpoint
		want   string
	}{
		{"no frozen layer", fsSize, ckclient.Checkpoint{Meta: checkpoint.Meta{Contents: checkpoint.MemoryOnly}}, "-"},
		{"usage unknown", fsSize, ckclient.Checkpoint{Meta: checkpoint.Meta{Contents: checkpoint.FSOnly}}, "?"},
		{"usage", fsSize, ckclient.Checkpoint{Meta: checkpoint.Meta{Contents: checkpoint.MemoryAndFS}, Filesystem: &ckclient.FSUsage{Bytes: 12_000}}, "12kB"},
		{"no memory dump", memStored, ckclient.Checkpoint{Meta: checkpoint.Meta{Contents: checkpoint.FSOnly}}, "-"},
		{"image directory gone", memStored, ckclient.Checkpoint{Meta: checkpoint.Meta{Contents: checkpoint.MemoryOnly, MemoryBytes: 4_200_000}}, "?"},
		{"stored", memStored, ckclient.Checkpoint{Meta: checkpoint.Meta{Contents: checkpoint.MemoryAndFS, MemoryBytes: 4_200_000}, MemoryStoredBytes: &stored}, "12kB"},
	} {
		if got := tc.column(tc.view); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestEachCheckpoint(t *testing.T) {
	tree := checkpoint.NewTree([]checkpoint.Record{
		record("aaaaaaaaaaaa", "", checkpoint.MemoryOnly, time.Hour),
		record("abbbbbbbbbbb", "", checkpoint.MemoryOnly, time.Hour),
		record("cccccccccccc", "", checkpoint.MemoryOnly, time.Hour),
	})
	var stderr bytes.Buffer
	var done []string
	err := eachCheckpoint(&cli{stderr: &stderr}, []string{"aa", "zz", "a", "cccccccccccc"}, func(ref string) error {
		n, err := tree.Lookup(ref)
		if err == nil {
			done = append(done, n.ID)
		}
		return err
	})
	if strings.Join(done, " ") != "aaaaaaaaaaaa cccccccccccc" {
		t.Errorf("done %v, want the two that exist, in order", done)
	}
	if err == nil || err.Error() != "2 of 4 checkpoints failed" {
		t.Errorf("error %v, want 2 of 4 failed", err)
	}
	for _, s := range []string{`no checkpoint "zz"`, `prefix "a" is ambiguous`} {
		if !strings.Contains(stderr.String(), s) {
			t.Errorf("stderr %q does not say %q", stderr.String(), s)
		}
	}
}
