package pagechain

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cklite/cklite/pkg/criuimage"
)

// restored is process pid's memory as a restore reads dir: through OpenRestore's directory, with
// the materialisation cache in a directory of the test's. It also checks that a chain without a
// compressed pages file is read in place, and that the copy's links are relative.
func restored(t *testing.T, dir string) mem {
	t.Helper()
	r, err := OpenRestore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
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
	if anyCompressed && filepath.Dir(r.Dir) != CacheRoot {
		t.Fatalf("restore reads %s, not a copy in the cache", r.Dir)
	}
	entries, _ := os.ReadDir(r.Dir)
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		if target, _ := os.Readlink(filepath.Join(r.Dir, e.Name())); filepath.IsAbs(target) {
			t.Errorf("%s links to %s: CRIU resolves an absolute link in the container's root", e.Name(), target)
		}
	}
	return memory(t, r.Dir)
}

// testCache puts the materialisation cache in a directory of the test's.
func testCache(t *testing.T) string {
	old := CacheRoot
	CacheRoot = filepath.Join(t.TempDir(), "cache")
	t.Cleanup(func() { CacheRoot = old })
	return CacheRoot
}

// copies are the copies in the cache.
func copies(t *testing.T, cache string) []string {
	t.Helper()
	entries, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
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
			testCache(t)
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
			testCache(t)
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

// TestRestoreCache: restores of checkpoints that share levels share their copies; a copy a
// restore holds survives eviction, the others go; a stored directory that changes gets a new copy.
func TestRestoreCache(t *testing.T) {
	cache := testCache(t)
	_, g, p, c, want := chain(t)
	compressAll(t, g, p)
	r1, err := OpenRestore(c)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(copies(t, cache)); n != 3 {
		t.Fatalf("%d copies after restoring c, want 3 (c, p, g): %v", n, copies(t, cache))
	}
	r2, err := OpenRestore(p)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(copies(t, cache)); n != 3 {
		t.Fatalf("restoring p made a copy: %v", copies(t, cache))
	}
	if filepath.Dir(r1.Dir) != cache || filepath.Base(r2.Dir) != filepath.Base(mustReadlink(t, filepath.Join(r1.Dir, "parent"))) {
		t.Fatalf("c's copy %s does not read p's copy %s", r1.Dir, r2.Dir)
	}
	old := cacheMax
	cacheMax = 0
	defer func() { cacheMax = old }()
	r2.Close()
	evict(cache)
	if n := len(copies(t, cache)); n != 3 {
		t.Fatalf("eviction removed a copy a restore holds: %v", copies(t, cache))
	}
	if got := memory(t, r1.Dir); !mapsEqual(got, want["c"]) {
		t.Fatalf("c through its copy after eviction: %v", got)
	}
	r1.Close()
	evict(cache)
	if n := len(copies(t, cache)); n != 0 {
		t.Fatalf("eviction left unused copies: %v", copies(t, cache))
	}
	// p rewritten (its pages copied into c by a Detach, its own compressed again): new copies.
	if _, err := Detach(c); err != nil {
		t.Fatal(err)
	}
	compressAll(t, c)
	if got := restored(t, c); !mapsEqual(got, want["c"]) {
		t.Fatalf("c after Detach: %v", got)
	}
}

func mustReadlink(t *testing.T, path string) string {
	t.Helper()
	s, err := os.Readlink(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMaterialiseAhead: the copies Materialise makes once a checkpoint is compressed are the ones
// its restores read, after the shim has written the deduplication's report into the directory.
func TestMaterialiseAhead(t *testing.T) {
	cache := testCache(t)
	_, g, p, c, want := chain(t)
	compressAll(t, g, p, c)
	if err := Materialise(c); err != nil {
		t.Fatal(err)
	}
	made := copies(t, cache)
	if len(made) != 3 {
		t.Fatalf("%d copies after materialising c, want 3 (c, p, g): %v", len(made), made)
	}
	if err := WriteReport(c, Report{Parent: "p"}); err != nil {
		t.Fatal(err)
	}
	if got := restored(t, c); !mapsEqual(got, want["c"]) {
		t.Fatalf("c restored: %v, want %v", got, want["c"])
	}
	if now := copies(t, cache); !slices.Equal(now, made) {
		t.Fatalf("the restore made copies of its own: %v, materialised ahead %v", now, made)
	}
}
