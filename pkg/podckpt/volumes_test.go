package podckpt

import (
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// tree is a directory's entries as Copy must reproduce them: path -> "d MODE", "f MODE CONTENT",
// "l TARGET" or "p MODE".
type tree map[string]string

func readTree(t *testing.T, root string) tree {
	t.Helper()
	got := tree{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode()
		switch {
		case mode.IsDir():
			got[rel] = "d " + mode.Perm().String()
		case mode.IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			got[rel] = "f " + (mode & (fs.ModePerm | fs.ModeSetuid)).String() + " " + string(b)
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			got[rel] = "l " + target
		case mode&fs.ModeNamedPipe != 0:
			got[rel] = "p " + mode.Perm().String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestCopy(t *testing.T) {
	for _, tc := range []struct {
		name  string
		make  func(t *testing.T, dir string)
		files int
	}{
		{"empty", func(*testing.T, string) {}, 0},
		{"files and dirs", func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, "seq"), "1\n2\n", 0o644)
			mkdir(t, filepath.Join(dir, "a", "b"), 0o750)
			write(t, filepath.Join(dir, "a", "b", "x"), "x", 0o600)
			write(t, filepath.Join(dir, "a", "run"), "#!/bin/sh", 0o4755)
		}, 3},
		{"symlinks and fifo", func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, "f"), "data", 0o644)
			if err := os.Symlink("f", filepath.Join(dir, "rel")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/nowhere", filepath.Join(dir, "dangling")); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mkfifo(filepath.Join(dir, "pipe"), 0o620); err != nil {
				t.Fatal(err)
			}
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := t.TempDir()
			tc.make(t, src)
			dst := filepath.Join(t.TempDir(), "copy")
			st, err := Copy(src, dst)
			if err != nil {
				t.Fatal(err)
			}
			want, got := readTree(t, src), readTree(t, dst)
			if len(got) != len(want) {
				t.Errorf("copy has %d entries, source %d: %v vs %v", len(got), len(want), got, want)
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s: copy %q, source %q", k, got[k], v)
				}
			}
			if st.Files != tc.files {
				t.Errorf("stats say %d files, want %d", st.Files, tc.files)
			}
		})
	}
}

// TestCopySnapshot checks that the copy is a snapshot: the source written in place afterwards
// (as an appended log is) leaves the copy as it was, which hard links would not.
func TestCopySnapshot(t *testing.T) {
	src := t.TempDir()
	write(t, filepath.Join(src, "seq"), "1\n", 0o644)
	dst := filepath.Join(t.TempDir(), "copy")
	if _, err := Copy(src, dst); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(src, "seq"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("2\n")
	f.Close()
	if b, _ := os.ReadFile(filepath.Join(dst, "seq")); string(b) != "1\n" {
		t.Errorf("copy changed with its source: %q", b)
	}
}

func TestCopyRefusesSocket(t *testing.T) {
	src := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(src, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := Copy(src, filepath.Join(t.TempDir(), "copy")); err == nil {
		t.Fatal("a socket was copied")
	}
}

// TestReplace checks that a volume gets exactly the copy's contents and stays the same directory
// (its inode: what containers bind-mount).
func TestReplace(t *testing.T) {
	saved := t.TempDir()
	write(t, filepath.Join(saved, "seq"), "1\n2\n", 0o644)
	mkdir(t, filepath.Join(saved, "d"), 0o755)
	vol := t.TempDir()
	write(t, filepath.Join(vol, "seq"), "1\n2\n3\n", 0o644)
	write(t, filepath.Join(vol, "marker"), "later", 0o644)
	mkdir(t, filepath.Join(vol, "d", "later"), 0o755)
	before := inode(t, vol)
	if _, err := Replace(vol, saved); err != nil {
		t.Fatal(err)
	}
	if inode(t, vol) != before {
		t.Error("Replace made a new directory")
	}
	want, got := readTree(t, saved), readTree(t, vol)
	if len(got) != len(want) || got["seq"] != want["seq"] || got["d"] != want["d"] {
		t.Errorf("volume after Replace: %v, want %v", got, want)
	}
}

func write(t *testing.T, path, data string, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask, with setuid
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// BenchmarkCopy copies a volume of 64 MiB in one file and 1000 files of 4 KiB, on the file system
// of TMPDIR: `TMPDIR=/var/lib go test -bench Copy ./pkg/podckpt` measures what a pod checkpoint's
// volume copy costs there (docs/pods.md).
func BenchmarkCopy(b *testing.B) {
	src := b.TempDir()
	big := make([]byte, 64<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if err := os.WriteFile(filepath.Join(src, "big"), big, 0o644); err != nil {
		b.Fatal(err)
	}
	small := big[:4096]
	for i := range 1000 {
		if err := os.WriteFile(filepath.Join(src, "f"+strconv.Itoa(i)), small, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	dst := b.TempDir()
	b.SetBytes(int64(len(big) + 1000*len(small)))
	b.ResetTimer()
	for i := range b.N {
		st, err := Copy(src, filepath.Join(dst, strconv.Itoa(i)))
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(st.Cloned), "cloned/op")
	}
}
