package pagechain

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestDedupShares: Dedup makes each CRIU image of the child equal to one of the parent's (bytes,
// mode and owner; the same name or another) a hard link to it, and no other file; removing the parent
// leaves the child's files and memory whole.
func TestDedupShares(t *testing.T) {
	m := seq(mem{}, 0, 4, "abcd")
	root := t.TempDir()
	parent := writeDump(t, root, "p", m, 1)
	child := writeDump(t, root, "c", seq(m, 1, 1, "X"), 1)
	files := []struct {
		parentName, childName, parentData, childData string
		childMode                                    os.FileMode
		shared                                       bool
	}{
		{"utsns-12.img", "utsns-12.img", "host", "host", 0o600, true},
		{"fs-7.img", "fs-9.img", "root and cwd", "root and cwd", 0o600, true},
		{"mm-1.img", "mm-1.img", "brk 1", "brk 2", 0o600, false},
		{"ids-1.img", "ids-1.img", "ids", "ids", 0o644, false},
		{"empty.img", "empty.img", "", "", 0o600, false},
		// Not CRIU's images: a restore may rewrite its stats in place.
		{"stats-restore", "stats-restore", "took 1 ms", "took 1 ms", 0o600, false},
		{"descriptors.json", "descriptors.json", "[]", "[]", 0o600, false},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(parent, f.parentName), []byte(f.parentData), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(child, f.childName), []byte(f.childData), f.childMode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(child, f.childName), f.childMode); err != nil {
			t.Fatal(err)
		}
	}
	res, err := Dedup(child, parent)
	if err != nil {
		t.Fatal(err)
	}
	// core-1.img, "core" in both dumps, is shared too.
	if res.SharedFiles != 3 || res.SharedBytes != int64(len("host")+len("root and cwd")+len("core")) {
		t.Errorf("shared %d files, %d bytes; want 3 files, %d bytes", res.SharedFiles, res.SharedBytes, len("host")+len("root and cwd")+len("core"))
	}
	for _, f := range files {
		if got := sameInode(t, filepath.Join(parent, f.parentName), filepath.Join(child, f.childName)); got != f.shared {
			t.Errorf("%s a link to the parent's %s: %v, want %v", f.childName, f.parentName, got, f.shared)
		}
	}
	leftovers(t, child)
	if _, err := Remove(parent); err != nil {
		t.Fatal(err)
	}
	if got, want := memory(t, child), seq(m, 1, 1, "X"); !mapsEqual(got, want) {
		t.Fatalf("child after removing the parent: %v, want %v", got, want)
	}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(child, f.childName))
		if err != nil || string(data) != f.childData {
			t.Errorf("%s after removing the parent: %q (%v), want %q", f.childName, data, err, f.childData)
		}
	}
}

func sameInode(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}
