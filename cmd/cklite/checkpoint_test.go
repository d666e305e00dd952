package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cklite/cklite/pkg/checkpoint"
)

var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func record(id, parent string, contents checkpoint.Contents, age time.Duration) checkpoint.Record {
	return checkpoint.Record{Meta: checkpoint.Meta{
		ID: id, Container: "web", Parent: parent, Contents: contents, Created: now.Add(-age), MemoryBytes: 4_200_000,
	}}
}

func TestWriteTree(t *testing.T) {
	root := record("aaaaaaaaaaaa", "", checkpoint.MemoryAndFS, time.Hour)
	root.ImagePath = "/var/lib/nerdctl/checkpoints/one"
	child := record("bbbbbbbbbbbb", "aaaaaaaaaaaa", checkpoint.FSOnly, 10*time.Minute)
	child.Expires = now.Add(2 * time.Hour)
	orphan := record("cccccccccccc", "dddddddddddd", checkpoint.MemoryOnly, 3*time.Minute)
	expired := record("eeeeeeeeeeee", "aaaaaaaaaaaa", checkpoint.MemoryAndFS, time.Minute)
	expired.Expires = now.Add(-time.Second)

	var out bytes.Buffer
	fsColumn := func(r checkpoint.Record) string { return "fs-of-" + r.ID[:2] }
	tree := checkpoint.NewTree([]checkpoint.Record{orphan, child, expired, root})
	if err := writeTree(&out, tree, fsColumn, now); err != nil {
		t.Fatal(err)
	}
	want := `ID                                       CONTAINER  CONTENTS   CREATED             MEMORY  FILESYSTEM  EXPIRES     IMAGE PATH
aaaaaaaaaaaa                             web        memory+fs  About an hour ago   4.2MB   fs-of-aa    never       /var/lib/nerdctl/checkpoints/one
├─ bbbbbbbbbbbb                          web        fs         10 minutes ago      -       fs-of-bb    in 2 hours  -
└─ eeeeeeeeeeee                          web        memory+fs  About a minute ago  4.2MB   fs-of-ee    expired     -
cccccccccccc (parent dddddddddddd gone)  web        memory     3 minutes ago       4.2MB   fs-of-cc    never       -
`
	if out.String() != want {
		t.Fatalf("ls printed:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestFSSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		view checkpointView
		want string
	}{
		{"no frozen layer", checkpointView{Meta: checkpoint.Meta{Contents: checkpoint.MemoryOnly}}, "-"},
		{"usage unknown", checkpointView{Meta: checkpoint.Meta{Contents: checkpoint.FSOnly}}, "?"},
		{"usage", checkpointView{Meta: checkpoint.Meta{Contents: checkpoint.MemoryAndFS}, Filesystem: &fsUsage{Bytes: 12_000}}, "12kB"},
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
	err := eachCheckpoint(&cli{stderr: &stderr}, tree, []string{"aa", "zz", "a", "cccccccccccc"}, func(n *checkpoint.Node) error {
		done = append(done, n.ID)
		return nil
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

func TestRemoveImageDir(t *testing.T) {
	const id = "aaaaaaaaaaaa"
	for _, tc := range []struct {
		name     string
		holds    string // the id in the directory's metadata; "" for no metadata file
		noDir    bool
		wantGone bool
		says     string
	}{
		{name: "its own directory", holds: id, wantGone: true},
		{name: "already gone", noDir: true, wantGone: true},
		{name: "reused by another checkpoint", holds: "bbbbbbbbbbbb", says: "now holds checkpoint bbbbbbbbbbbb"},
		{name: "not cklite's", says: "not a cklite checkpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "images")
			if !tc.noDir {
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "pages-1.img"), []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.holds != "" {
				if err := checkpoint.Write(dir, checkpoint.Meta{ID: tc.holds, Contents: checkpoint.MemoryOnly}); err != nil {
					t.Fatal(err)
				}
			}
			err := removeImageDir(checkpoint.Record{Meta: checkpoint.Meta{ID: id}, ImagePath: dir})
			if tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says)) {
				t.Fatalf("removeImageDir = %v, want an error saying %q", err, tc.says)
			}
			if tc.says == "" && err != nil {
				t.Fatal(err)
			}
			if _, serr := os.Stat(dir); os.IsNotExist(serr) != tc.wantGone {
				t.Fatalf("directory gone: %v, want %v", os.IsNotExist(serr), tc.wantGone)
			}
		})
	}
	if err := removeImageDir(checkpoint.Record{Meta: checkpoint.Meta{ID: id}}); err != nil {
		t.Fatalf("no recorded directory: %v", err)
	}
}
