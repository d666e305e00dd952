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

func TestFSSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		view ckclient.Checkpoint
		want string
	}{
		{"no frozen layer", ckclient.Checkpoint{Meta: checkpoint.Meta{Contents: checkpoint.MemoryOnly}}, "-"},
		{"usage unknown", ckclient.Checkpoint{Meta: checkpoint.Meta{Contents: checkpoint.FSOnly}}, "?"},
		{"usage", ckclient.Checkpoint{Meta: checkpoint.Meta{Contents: checkpoint.MemoryAndFS}, Filesystem: &ckclient.FSUsage{Bytes: 12_000}}, "12kB"},
	} {
		if got := fsSize(tc.view); got != tc.want {
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
