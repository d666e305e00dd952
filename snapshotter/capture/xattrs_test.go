package capture

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyXattrs: a capture keeps an entry's extended attributes but overlayfs's opaque mark
// (set apart) and its upper-only bookkeeping, which a lower layer does without.
func TestCopyXattrs(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("trusted.* attributes need root")
	}
	for _, tc := range []struct {
		name string
		dir  bool
		copy func(src, dst string) error
	}{{"directory", true, copyXattrs}, {"file", false, copyXattrs}, {"file, by its descriptors", false, fileMetaOf}} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			src, dst := filepath.Join(root, "src"), filepath.Join(root, "dst")
			for _, p := range []string{src, dst} {
				if tc.dir {
					must(t, os.Mkdir(p, 0o755))
				} else {
					must(t, os.WriteFile(p, nil, 0o644))
				}
			}
			for name, v := range map[string]string{
				"user.k": "v", "trusted.overlay.origin": "\x00\xfb\x1d", "trusted.overlay.impure": "y", opaqueXattr: "y",
			} {
				must(t, unix.Lsetxattr(src, name, []byte(v), 0))
			}
			must(t, tc.copy(src, dst))
			got, err := listXattrs(dst)
			must(t, err)
			if !slices.Equal(got, []string{"user.k"}) {
				t.Errorf("%s copied with %v, want [user.k]", tc.name, got)
			}
		})
	}
}

// fileMetaOf is fileMeta between regular files src and dst.
func fileMetaOf(src, dst string) error {
	st, err := lstat(src)
	if err != nil {
		return err
	}
	in, err := unix.Open(src, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	out, err := unix.Open(dst, unix.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(out)
	return fileMeta(in, out, st)
}

// TestCopyData: a regular file's bytes are copied whole with copy_file_range on one filesystem,
// and by reading and writing from another (tmpfs to the test's directory: EXDEV).
func TestCopyData(t *testing.T) {
	for _, tc := range []struct {
		name, from string
		size       int
	}{
		{"empty", "", 0},
		{"small", "", 100},
		{"larger than the read buffer", "", 300 << 10},
		{"from another filesystem", "/dev/shm", 300 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			from := dir
			if tc.from != "" {
				from = mkdirTemp(t, tc.from)
			}
			data := make([]byte, tc.size)
			for i := range data {
				data[i] = byte(i * 7)
			}
			src, dst := filepath.Join(from, "src"), filepath.Join(dir, "dst")
			must(t, os.WriteFile(src, data, 0o644))
			in, err := unix.Open(src, unix.O_RDONLY, 0)
			must(t, err)
			defer unix.Close(in)
			out, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT, 0o600)
			must(t, err)
			defer unix.Close(out)
			must(t, copyData(in, out, int64(tc.size)))
			got, err := os.ReadFile(dst)
			must(t, err)
			if !bytes.Equal(got, data) {
				t.Fatalf("copied %d bytes, want the %d of the source", len(got), len(data))
			}
		})
	}
}

// mkdirTemp is a directory below parent, removed when the test ends.
func mkdirTemp(t *testing.T, parent string) string {
	dir, err := os.MkdirTemp(parent, "capture-test-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
