package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestCheckImages(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		want  string // "" for no error, else a part of the message
	}{
		{name: "complete", files: []string{"inventory.img", "pagemap-1.img", "pagemap-18.img", "pages-1.img", "pages-2.img"}},
		{name: "no memory", files: []string{"inventory.img"}},
		{name: "not an image", files: []string{"descriptors.json"}, want: "no inventory.img"},
		{name: "page file missing", files: []string{"inventory.img", "pagemap-1.img", "pagemap-18.img", "pages-1.img"}, want: "pages-2.img is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
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
