package client

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/pagechain"
)

// TestMemoryStored counts an image directory's own CRIU files: not cklite's, not the parent's
// through the parent link, not those that are hard links to the parent's.
func TestMemoryStored(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]int
		link  bool
		// shared are files made hard links to the parent's file of that name.
		shared []string
		want   int64
	}{
		{"full dump", map[string]int{"pages-1.img": 8192, "pagemap-1.img": 100, checkpoint.MetaFile: 700}, false, nil, 8292},
		{"deduplicated", map[string]int{"pages-2.img": 4096, "pagemap-1.img": 120, checkpoint.MetaFile: 700, pagechain.ReportFile: 300}, true, nil, 4216},
		{"files shared", map[string]int{"pages-2.img": 4096, "pagemap-1.img": 120, checkpoint.MetaFile: 700}, true, []string{"utsns-12.img"}, 4216},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir, parent := filepath.Join(root, "child"), filepath.Join(root, "parent")
			for _, d := range []string{dir, parent} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(parent, "pages-1.img"), make([]byte, 1<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.link {
				if err := os.Symlink("../parent", filepath.Join(dir, "parent")); err != nil {
					t.Fatal(err)
				}
			}
			for name, n := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), make([]byte, n), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			for _, name := range tc.shared {
				if err := os.WriteFile(filepath.Join(parent, name), make([]byte, 24), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Link(filepath.Join(parent, name), filepath.Join(dir, name)); err != nil {
					t.Fatal(err)
				}
			}
			got, err := MemoryStored(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("%d bytes, want %d", got, tc.want)
			}
		})
	}
}
