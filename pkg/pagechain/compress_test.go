package pagechain

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cklite/cklite/pkg/criuimage"
)

// restored is process pid's memory as a restore reads dir: through OpenRestore's directory.
// It also checks that the materialised copy is gone after Close, and that a chain without a
// compressed pages file is read in place.
func restored(t *testing.T, dir string) mem {
	t.Helper()
	work := t.TempDir()
	r, err := OpenRestore(dir, work)
	if err != nil {
		t.Fatal(err)
	}
	anyCompressed := false
	for _, d := range r.Dirs {
		c, err := hasCompressed(d)
		if err != nil {
			t.Fatal(err)
		}
		anyCompressed = anyCompressed || c
	}
	if (r.Dir != dir) != anyCompressed {
		t.Fatalf("restore reads %s, compressed pages in the chain: %v", r.Dir, anyCompressed)
	}
	links := 0
	_ = filepath.WalkDir(filepath.Dir(r.Dir), func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type()&os.ModeSymlink != 0 {
			links++
			if target, _ := os.Readlink(path); filepath.IsAbs(target) {
				t.Errorf("%s links to %s: CRIU resolves an absolute link in the container's root", path, target)
			}
		}
		return nil
	})
	if anyCompressed && links == 0 {
		t.Fatalf("no links in the materialised copy %s", r.Dir)
	}
	m := memory(t, r.Dir)
	r.Close()
	if _, err := os.Stat(r.tmp); anyCompressed && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("materialised copy %s left after Close: %v", r.tmp, err)
	}
	return m
}

func compressAll(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		c, err := Compress(d)
		if err != nil {
			t.Fatal(err)
		}
		if c.Files != 1 || c.BytesAfter >= c.BytesBefore {
			t.Fatalf("%s: compressed %+v, want its pages file smaller", d, c)
		}
	}
}

// TestCompressRestore compresses parts of a chain g <- p <- c and reads every directory as a
// restore does; then deduplicates a new child against a compressed parent, and removes the
// middle of a compressed chain (Detach reads compressed pages).
func TestCompressRestore(t *testing.T) {
	for _, tc := range []struct {
		name       string
		compressed []string
	}{
		{name: "none"},
		{name: "newest", compressed: []string{"c"}},
		{name: "middle", compressed: []string{"p"}},
		{name: "root", compressed: []string{"g"}},
		{name: "all", compressed: []string{"g", "p", "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, g, p, c, want := chain(t)
			for _, n := range tc.compressed {
				compressAll(t, filepath.Join(root, n))
			}
			for name, dir := range map[string]string{"g": g, "p": p, "c": c} {
				if got := restored(t, dir); !mapsEqual(got, want[name]) {
					t.Fatalf("%s restored: %v, want %v", name, got, want[name])
				}
				leftovers(t, dir)
			}
			if c, err := Compress(c); err != nil || (c.Files != 0) != !strings.Contains(strings.Join(tc.compressed, ""), "c") {
				t.Fatalf("second Compress of c: %+v %v", c, err)
			}
			// A new checkpoint deduplicated against a compressed parent.
			dm := seq(seq(mem{}, 0, 9, "abCDeFghI"), 0, 2, "ZY")
			d := writeDump(t, root, "d", dm, 1)
			if res, err := Dedup(d, c); err != nil || res.InParent != 7 {
				t.Fatalf("Dedup against c: %+v %v", res, err)
			}
			compressAll(t, d)
			if got := restored(t, d); !mapsEqual(got, dm) {
				t.Fatalf("d restored: %v, want %v", got, dm)
			}
			// Removing p detaches c, which reads p's pages, compressed or not.
			if _, err := Remove(p); err != nil {
				t.Fatal(err)
			}
			for name, dir := range map[string]string{"c": c, "d": d} {
				wantMem := dm
				if name == "c" {
					wantMem = want["c"]
				}
				if got := restored(t, dir); !mapsEqual(got, wantMem) {
					t.Fatalf("%s after removing p: %v, want %v", name, got, wantMem)
				}
			}
		})
	}
}

// TestCompressedPagesSize: admission and CheckImages see a compressed pages file's plain size.
func TestCompressedPagesSize(t *testing.T) {
	dir := writeDump(t, t.TempDir(), "d", seq(mem{}, 0, 5, "abcde"), 3)
	compressAll(t, dir)
	if _, err := os.Stat(filepath.Join(dir, "pages-3.img")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("plain pages file still there: %v", err)
	}
	size, err := criuimage.PagesSize(dir, "pages-3.img")
	if err != nil || size != 5*int64(pageSize) {
		t.Fatalf("PagesSize %d %v, want 5 pages", size, err)
	}
	if _, err := criuimage.PagesSize(dir, "pages-4.img"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("PagesSize of a missing pages file: %v", err)
	}
}

// TestKilledCompress leaves what a kill mid-Compress leaves: a temporary compressed file (before
// the rename), or both forms (after the rename, before the plain file's removal). The directory
// restores as it was at every point, and the next Compress finishes and sweeps.
func TestKilledCompress(t *testing.T) {
	m := seq(mem{}, 0, 6, "abcdef")
	for _, stage := range []string{"tmp", "both"} {
		t.Run(stage, func(t *testing.T) {
			root := t.TempDir()
			done := writeDump(t, root, "done", m, 1)
			compressAll(t, done)
			zst, err := os.ReadFile(filepath.Join(done, "pages-1.img"+criuimage.CompressedSuffix))
			if err != nil {
				t.Fatal(err)
			}
			dir := writeDump(t, root, "d", m, 1)
			name := "pages-1.img" + criuimage.CompressedSuffix
			if stage == "tmp" {
				name = "." + name + ".tmp"
				zst = zst[:len(zst)/2] // cut short by the kill
			}
			if err := os.WriteFile(filepath.Join(dir, name), zst, 0o600); err != nil {
				t.Fatal(err)
			}
			if got := restored(t, dir); !mapsEqual(got, m) {
				t.Fatalf("restored after the kill: %v", got)
			}
			if _, err := Compress(dir); err != nil {
				t.Fatal(err)
			}
			if got := restored(t, dir); !mapsEqual(got, m) {
				t.Fatalf("restored after the next Compress: %v", got)
			}
			if _, err := os.Stat(filepath.Join(dir, "pages-1.img")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("plain pages file still there: %v", err)
			}
			leftovers(t, dir)
		})
	}
}
