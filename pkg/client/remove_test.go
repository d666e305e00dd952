package client

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cklite/cklite/pkg/checkpoint"
)

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
