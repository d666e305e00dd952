package fork

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/checkpoint"
)

func TestSourceOf(t *testing.T) {
	meta := func(id string) checkpoint.Meta {
		return checkpoint.Meta{ID: id, Namespace: "default", Container: "web", Contents: checkpoint.MemoryAndFS,
			Snapshotter: "cklite", Frozen: checkpoint.FrozenName(id), Created: time.Unix(0, 0).UTC()}
	}
	root := t.TempDir()
	imageDir := func(name, id string) string {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if id != "" {
			if err := checkpoint.Write(dir, meta(id)); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	recorded := imageDir("recorded", "aaaaaaaaaaaa")
	other := imageDir("other", "bbbbbbbbbbbb")
	copied := imageDir("copied", "aaaaaaaaaaaa")
	stock := imageDir("stock", "")

	for _, tc := range []struct {
		name      string
		imagePath string // the record's
		dir       string // given
		wantDir   string
		isErr     func(error) bool
		says      string
	}{
		{name: "the recorded directory", imagePath: recorded, wantDir: recorded},
		{name: "a given directory wins", imagePath: recorded, dir: copied, wantDir: copied},
		{name: "a given directory, none recorded", dir: copied, wantDir: copied},
		{name: "none: the images were temporary", isErr: errdefs.IsFailedPrecondition, says: "ctr tasks checkpoint --image-path"},
		{name: "recorded directory removed", imagePath: filepath.Join(root, "gone"), isErr: errdefs.IsNotFound, says: "no longer exists"},
		{name: "another checkpoint's directory", dir: other, isErr: errdefs.IsInvalidArgument, says: "holds checkpoint bbbbbbbbbbbb, not aaaaaaaaaaaa"},
		{name: "a stock runc checkpoint", dir: stock, isErr: errdefs.IsNotFound, says: "not a cklite checkpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := SourceOf(checkpoint.Record{Meta: meta("aaaaaaaaaaaa"), ImagePath: tc.imagePath}, tc.dir)
			if tc.isErr != nil {
				if err == nil || !tc.isErr(err) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("SourceOf = %+v, %v; want an error saying %q", src, err, tc.says)
				}
				return
			}
			if err != nil || src.ImageDir != tc.wantDir || src.Checkpoint.ID != "aaaaaaaaaaaa" {
				t.Fatalf("SourceOf = %+v, %v; want checkpoint aaaaaaaaaaaa in %s", src, err, tc.wantDir)
			}
		})
	}
}

// The shim opens the image directory from its own working directory.
func TestFromImageDirIsAbsolute(t *testing.T) {
	dir := t.TempDir()
	if err := checkpoint.Write(dir, checkpoint.Meta{ID: "cccccccccccc", Contents: checkpoint.MemoryOnly}); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Dir(dir))
	src, err := FromImageDir(filepath.Base(dir))
	if err != nil {
		t.Fatal(err)
	}
	if src.ImageDir != dir {
		t.Fatalf("image directory %s, want %s", src.ImageDir, dir)
	}
}
