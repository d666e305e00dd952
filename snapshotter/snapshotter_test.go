//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/continuity/fs/fstest"
	"golang.org/x/sys/unix"
)

func newTestSnapshotter(t testing.TB, opts ...Opt) *Snapshotter {
	t.Helper()
	requireRoot(t)
	s, err := New(context.Background(), t.TempDir(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestCommitKeepsTheUpper: a commit is O(1) because the committed layer is the very directory
// that was the upper — same inode, nothing copied — and the next Prepare gets an empty upper.
func TestCommitKeepsTheUpper(t *testing.T) {
	s := newTestSnapshotter(t)
	ctx := context.Background()
	if _, err := s.Prepare(ctx, "k", ""); err != nil {
		t.Fatal(err)
	}
	upper := upperOf(t, s, "k")
	if err := os.WriteFile(filepath.Join(upper, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := inode(t, upper)
	if err := s.Commit(ctx, "frozen", "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, "k", "frozen"); err != nil {
		t.Fatal(err)
	}
	if after := inode(t, upper); after != before {
		t.Fatalf("the committed layer is inode %d, the upper was %d: it was copied", after, before)
	}
	if entries, err := os.ReadDir(upperOf(t, s, "k")); err != nil || len(entries) != 0 {
		t.Fatalf("the new upper holds %v (%v), want it empty", entries, err)
	}
	usage, err := s.Usage(ctx, "frozen")
	if err != nil || usage.Inodes != 2 {
		t.Fatalf("usage of the frozen layer: %+v %v, want 2 inodes (its root and f)", usage, err)
	}
}

// upperOf is the directory an active snapshot's mounts write to, for cklite or containerd's
// overlayfs snapshotter alike.
func upperOf(t testing.TB, sn snapshots.Snapshotter, key string) string {
	t.Helper()
	mounts, err := sn.Mounts(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range mounts[0].Options {
		if v, ok := strings.CutPrefix(o, "upperdir="); ok {
			return v
		}
	}
	return mounts[0].Source // a bind mount: no parent
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

// TestNewRefusesRoot: a root whose filesystem cannot be an overlay upper (here overlayfs itself)
// is refused with the cause, before anything is written into it.
func TestNewRefusesRoot(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	for _, d := range []string{"l", "u", "w", "m"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m := mount.Mount{Type: "overlay", Source: "overlay", Options: []string{
		"lowerdir=" + filepath.Join(dir, "l"), "upperdir=" + filepath.Join(dir, "u"), "workdir=" + filepath.Join(dir, "w")}}
	target := filepath.Join(dir, "m")
	if err := m.Mount(target); err != nil {
		t.Fatal(err)
	}
	defer mount.UnmountAll(target, 0) //nolint:errcheck
	root := filepath.Join(target, "root")
	_, err := New(context.Background(), root)
	if err == nil || !strings.Contains(err.Error(), "cannot hold overlay layers") {
		t.Fatalf("got %v, want a refusal of the root", err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("the refused root was written to: %v", entries)
	}
}

// TestRenameLowerDirectory pins down what a user loses without overlayfs redirect_dir: renaming
// a directory that comes from a lower layer fails with EXDEV (tools like mv then copy); with
// redirect_dir it works. containerd's overlayfs snapshotter behaves the same.
func TestRenameLowerDirectory(t *testing.T) {
	s := newTestSnapshotter(t)
	ctx := context.Background()
	if _, err := s.Prepare(ctx, "base", ""); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(upperOf(t, s, "base"), "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "layer", "base"); err != nil {
		t.Fatal(err)
	}
	mounts, err := s.Prepare(ctx, "top", "layer")
	if err != nil {
		t.Fatal(err)
	}
	err = mount.WithTempMount(ctx, mounts, func(root string) error {
		return os.Rename(filepath.Join(root, "dir"), filepath.Join(root, "renamed"))
	})
	if redirectDirEnabled() {
		if err != nil {
			t.Fatalf("rename with redirect_dir: %v", err)
		}
	} else if !errors.Is(err, unix.EXDEV) {
		t.Fatalf("rename of a lower directory without redirect_dir: %v, want EXDEV", err)
	}
}

// TestApplyLayer checks merges against overlayfs itself: for each stack of layers, a mount of
// base plus the layers one by one must show the same tree as a mount of base plus their merge.
func TestApplyLayer(t *testing.T) {
	requireRoot(t)
	base := fstest.Apply(
		fstest.CreateDir("/d", 0o755),
		fstest.CreateFile("/d/keep", []byte("keep"), 0o644),
		fstest.CreateFile("/d/gone", []byte("gone"), 0o644),
		fstest.CreateFile("/f", []byte("base f"), 0o644),
		fstest.CreateDir("/tree/sub", 0o700),
		fstest.CreateFile("/tree/sub/x", []byte("x"), 0o600),
		fstest.Symlink("f", "/link"),
	)
	for _, tc := range []struct {
		name   string
		layers []fstest.Applier // applied through overlay, bottom first
	}{
		{"file changes", []fstest.Applier{
			fstest.Apply(fstest.CreateFile("/f", []byte("one"), 0o600), fstest.CreateFile("/new", []byte("n"), 0o644)),
			fstest.Apply(fstest.CreateFile("/f", []byte("two"), 0o644), fstest.Chown("/new", 1000, 1000)),
		}},
		{"whiteouts", []fstest.Applier{
			fstest.Apply(fstest.Remove("/d/gone"), fstest.Remove("/link")),
			fstest.Apply(fstest.CreateFile("/d/gone", []byte("back"), 0o644)),
			fstest.Apply(fstest.RemoveAll("/tree")),
		}},
		{"opaque directories", []fstest.Applier{
			fstest.Apply(fstest.RemoveAll("/d"), fstest.CreateDir("/d", 0o711), fstest.CreateFile("/d/only", []byte("o"), 0o644)),
			fstest.Apply(fstest.CreateFile("/d/more", []byte("m"), 0o644)),
			fstest.Apply(fstest.RemoveAll("/tree/sub"), fstest.CreateDir("/tree/sub", 0o755)),
		}},
		{"type changes", []fstest.Applier{
			fstest.Apply(fstest.Remove("/f"), fstest.CreateDir("/f", 0o755), fstest.CreateFile("/f/in", []byte("i"), 0o644)),
			fstest.Apply(fstest.RemoveAll("/d"), fstest.CreateFile("/d", []byte("now a file"), 0o644)),
			fstest.Apply(fstest.Remove("/d"), fstest.CreateDir("/d", 0o755)),
		}},
		{"directory attributes", []fstest.Applier{
			fstest.Apply(fstest.Chmod("/tree", 0o750), fstest.CreateFile("/tree/t", nil, 0o644)),
			fstest.Apply(fstest.Chown("/tree/sub", 7, 8), fstest.SetXAttr("/tree/sub", "user.tag", "v")),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSnapshotter(t, WithMergeFanOut(len(tc.layers)+1))
			parent := commitThroughOverlay(t, s, "", "base", base)
			for i, layer := range tc.layers {
				parent = commitThroughOverlay(t, s, parent, fmt.Sprintf("layer-%d", i), layer)
			}
			// The chain is base + layers; merging the layers alone stays inside it.
			if _, err := s.View(context.Background(), "chain-of-"+parent, parent); err != nil {
				t.Fatal(err)
			}
			// From the metadata, not from the mount options: a background merge may already
			// stand in for the chain there.
			chain := chainOf(t, s, "chain-of-"+parent)
			var stackedDirs []string // top first
			for _, id := range chain {
				stackedDirs = append(stackedDirs, s.upperPath(id))
			}
			stacked := mountLowers(t, stackedDirs)
			merged := filepath.Join(t.TempDir(), "merged")
			if err := s.merges.merge(merged, layerDirs(s, chain[:len(tc.layers)])); err != nil {
				t.Fatal(err)
			}
			viaMerge := mountLowers(t, []string{merged, s.upperPath(chain[len(chain)-1])})
			if err := fstest.CheckDirectoryEqual(stacked, viaMerge); err != nil {
				t.Fatalf("the merge shows another tree than its layers: %v", err)
			}
		})
	}
}

// commitThroughOverlay prepares a snapshot on parent, applies a through an overlay mount (so the
// layer holds real whiteouts and opaque directories) and commits it as name.
func commitThroughOverlay(t *testing.T, s *Snapshotter, parent, name string, a fstest.Applier) string {
	t.Helper()
	ctx := context.Background()
	mounts, err := s.Prepare(ctx, "prep-"+name, parent)
	if err != nil {
		t.Fatal(err)
	}
	if err := mount.WithTempMount(ctx, mounts, a.Apply); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, name, "prep-"+name); err != nil {
		t.Fatal(err)
	}
	return name
}

func layerDirs(s *Snapshotter, ids []string) []string {
	var dirs []string // bottom first
	for i := len(ids) - 1; i >= 0; i-- {
		dirs = append(dirs, s.upperPath(ids[i]))
	}
	return dirs
}

// TestViewOfMergedChain: once one merge stands for a view's whole chain, the view still mounts
// (overlayfs refuses a single lower dir without an upper) and shows the chain's files.
func TestViewOfMergedChain(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	s := newTestSnapshotter(t, WithMergeFanOut(2))
	parent := commitThroughOverlay(t, s, "", "base", fstest.CreateFile("/f", []byte("base"), 0o644))
	parent = commitThroughOverlay(t, s, parent, "top", fstest.CreateFile("/f", []byte("top"), 0o644))
	if _, err := s.View(ctx, "view", parent); err != nil {
		t.Fatal(err)
	}
	chain := chainOf(t, s, "view")
	if err := s.merges.ensure(mergeJob(chain)); err != nil {
		t.Fatal(err)
	}
	mounts, err := s.Mounts(ctx, "view")
	if err != nil {
		t.Fatal(err)
	}
	if mounts[0].Source != s.merges.mergePath(chain[0], len(chain)) {
		t.Fatalf("the view does not use the merge: %+v", mounts)
	}
	err = mount.WithReadonlyTempMount(ctx, mounts, func(root string) error {
		return fstest.CheckDirectoryEqualWithApplier(root, fstest.CreateFile("/f", []byte("top"), 0o644))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// mountLowers mounts a read-only overlay of lowers (top first) and returns where.
func mountLowers(t *testing.T, lowers []string) string {
	t.Helper()
	target := t.TempDir()
	m := mount.Mount{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=" + strings.Join(lowers, ":")}}
	if err := m.Mount(target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mount.UnmountAll(target, 0) }) //nolint:errcheck
	return target
}

// TestDedup: identical files of committed layers become one inode; files differing in content
// or in any attribute a hard link would share stay apart.
func TestDedup(t *testing.T) {
	s := newTestSnapshotter(t, WithDedup)
	ctx := context.Background()
	content := []byte(strings.Repeat("dedup me ", 1000))
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	write := func(dir, name string, data []byte, mode os.FileMode, at time.Time) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	var layers []string
	for i := range 3 {
		key := fmt.Sprintf("k%d", i)
		if _, err := s.Prepare(ctx, key, ""); err != nil {
			t.Fatal(err)
		}
		upper := upperOf(t, s, key)
		write(upper, "same", content, 0o644, mtime)
		write(upper, "other-mode", content, 0o600+os.FileMode(i), mtime)
		write(upper, "other-time", content, 0o644, mtime.Add(time.Duration(i)*time.Second))
		write(upper, "other-content", append([]byte{byte(i)}, content...), 0o644, mtime)
		if err := s.Commit(ctx, fmt.Sprintf("layer-%d", i), key); err != nil {
			t.Fatal(err)
		}
		layers = append(layers, upper)
	}
	s.dedup.wait()
	for _, tc := range []struct {
		file   string
		shared bool
	}{{"same", true}, {"other-mode", false}, {"other-time", false}, {"other-content", false}} {
		first := inode(t, filepath.Join(layers[0], tc.file))
		for _, l := range layers[1:] {
			if got := inode(t, filepath.Join(l, tc.file)) == first; got != tc.shared {
				t.Errorf("%s shared across layers: %v, want %v", tc.file, got, tc.shared)
			}
		}
		if b, err := os.ReadFile(filepath.Join(layers[2], tc.file)); err != nil || len(b) < len(content) {
			t.Errorf("%s after dedup: %d bytes, %v", tc.file, len(b), err)
		}
	}
}
