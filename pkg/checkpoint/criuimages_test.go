package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/criuimage"
)

func TestCheckImages(t *testing.T) {
	// The pages file each pagemap names: as CRIU numbers them, and pagemap-18's rewritten (pkg/pagechain).
	pagesIDs := map[string]uint32{"pagemap-1.img": 1, "pagemap-18.img": 2, "pagemap-20.img": 7}
	for _, tc := range []struct {
		name  string
		files []string
		want  string // "" for no error, else a part of the message
	}{
		{name: "complete", files: []string{"inventory.img", "pagemap-1.img", "pagemap-18.img", "pages-1.img", "pages-2.img"}},
		{name: "no memory", files: []string{"inventory.img"}},
		{name: "not an image", files: []string{"descriptors.json"}, want: "no inventory.img"},
		{name: "page file missing", files: []string{"inventory.img", "pagemap-1.img", "pagemap-18.img", "pages-1.img"}, want: "pages-2.img is missing"},
		{name: "rewritten page file", files: []string{"inventory.img", "pagemap-1.img", "pagemap-20.img", "pages-1.img", "pages-7.img"}},
		{name: "rewritten page file missing", files: []string{"inventory.img", "pagemap-1.img", "pagemap-20.img", "pages-1.img", "pages-2.img"}, want: "pages-7.img is missing (named by pagemap-20.img)"},
		{name: "pagemap corrupt", files: []string{"inventory.img", "pagemap-3.img"}, want: "pagemap-3.img: too short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				var data []byte // pagemap-3.img: empty, no head
				if id, ok := pagesIDs[f]; ok {
					data = criuimage.PagemapFile{PagesID: id}.Encode()
				}
				if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := CheckImages(dir)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("CheckImages: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errdefs.IsInvalidArgument(err)):
				t.Fatalf("CheckImages = %v, want an invalid-argument error naming %q", err, tc.want)
			}
		})
	}
}
