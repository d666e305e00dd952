package pagechain

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/criuimage"
)

// mem is a process's memory as a test states it: page contents by virtual address. A content
// of "" is a run flagged neither present nor in-parent (left alone by every rewrite).
type mem map[uint64]string

const (
	base = 0x400000
	pid  = 1
)

func addr(page int) uint64 { return base + uint64(page)*pageSize }

// pageData is the page of content s: s repeated over the page.
func pageData(s string) []byte {
	return bytes.Repeat([]byte(s), int(pageSize)/len(s)+1)[:pageSize]
}

// writeDump writes a full dump of m (present runs) for process pid into a new directory below
// root, with its pages in pages-<id>.img and the other files a dump has.
func writeDump(t *testing.T, root, name string, m mem, id uint32) string {
	t.Helper()
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	addrs := sortedAddrs(m)
	pm := criuimage.PagemapFile{PagesID: id}
	var pages []byte
	for _, a := range addrs {
		flags := uint32(criuimage.PagePresent | criuimage.PageLazy)
		if m[a] == "" {
			flags = 0
		} else {
			pages = append(pages, pageData(m[a])...)
		}
		if k := len(pm.Runs) - 1; k >= 0 && pm.Runs[k].End(pageSize) == a && pm.Runs[k].Flags == flags {
			pm.Runs[k].Pages++
		} else {
			pm.Runs = append(pm.Runs, criuimage.PageRun{Vaddr: a, Pages: 1, Flags: flags})
		}
	}
	files := map[string][]byte{
		criuimage.PagemapName(pid): pm.Encode(),
		pm.PagesName():             pages,
		"core-1.img":               []byte("core"),
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func sortedAddrs(m mem) []uint64 {
	var out []uint64
	for a := range m {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// memory reads process pid's memory back from dir as CRIU would: each present page from the
// directory's pages file, each in-parent page from the nearest parent that has it present.
func memory(t *testing.T, dir string) mem {
	t.Helper()
	pm, err := criuimage.ReadPagemap(filepath.Join(dir, criuimage.PagemapName(pid)))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, pm.PagesName()))
	if err != nil {
		t.Fatal(err)
	}
	if uint64(len(data)) != pm.PresentPages()*pageSize {
		t.Fatalf("%s: %s has %d bytes for %d pages", dir, pm.PagesName(), len(data), pm.PresentPages())
	}
	var parent mem
	out := mem{}
	var off uint64
	for _, r := range pm.Runs {
		for p := uint64(0); p < r.Pages; p++ {
			a := r.Vaddr + p*pageSize
			switch {
			case r.Present():
				out[a] = string(data[off : off+1])
				if !bytes.Equal(data[off:off+pageSize], pageData(out[a])) {
					t.Fatalf("%s: page %#x is not one page of %q", dir, a, out[a])
				}
				off += pageSize
			case r.InParent():
				if parent == nil {
					parent = memory(t, filepath.Join(dir, criuimage.ParentLink))
				}
				v, ok := parent[a]
				if !ok || v == "" {
					t.Fatalf("%s: page %#x in parent, which lacks it", dir, a)
				}
				out[a] = v
			default:
				out[a] = ""
			}
		}
	}
	return out
}

func pagesBytes(t *testing.T, dir string) int64 {
	t.Helper()
	pm, err := criuimage.ReadPagemap(filepath.Join(dir, criuimage.PagemapName(pid)))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, pm.PagesName()))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// seq is n pages from page first on, of contents from s (one letter a page, cycling).
func seq(m mem, first, n int, s string) mem {
	for i := 0; i < n; i++ {
		m[addr(first+i)] = string(s[i%len(s)])
	}
	return m
}

func TestDedup(t *testing.T) {
	parentMem := seq(mem{}, 0, 8, "abcdefgh")
	for _, tc := range []struct {
		name     string
		child    mem
		inParent uint64
	}{
		{name: "unchanged", child: seq(mem{}, 0, 8, "abcdefgh"), inParent: 8},
		{name: "all changed", child: seq(mem{}, 0, 8, "ABCDEFGH"), inParent: 0},
		{name: "middle changed", child: seq(seq(mem{}, 0, 8, "abcdefgh"), 3, 2, "XY"), inParent: 6},
		{name: "grown past the parent", child: seq(mem{}, 0, 12, "abcdefghijkl"), inParent: 8},
		{name: "moved by a page", child: seq(mem{}, 1, 8, "abcdefgh"), inParent: 0},
		{name: "hole in the child", child: seq(seq(mem{}, 0, 3, "abc"), 5, 3, "fgh"), inParent: 6},
		{name: "run neither present nor in-parent", child: mem{addr(0): "a", addr(1): "b", addr(2): "c", addr(3): "d", addr(4): "", addr(5): ""}, inParent: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			parent := writeDump(t, root, "p", parentMem, 1)
			child := writeDump(t, root, "c", tc.child, 1)
			before := pagesBytes(t, child)
			res, err := Dedup(child, parent)
			if err != nil {
				t.Fatal(err)
			}
			if res.InParent != tc.inParent {
				t.Errorf("%d pages in parent, want %d", res.InParent, tc.inParent)
			}
			if got := memory(t, child); !mapsEqual(got, tc.child) {
				t.Fatalf("memory after dedup %v, want %v", got, tc.child)
			}
			_, linked := os.Lstat(filepath.Join(child, criuimage.ParentLink))
			if want := tc.inParent > 0; (linked == nil) != want {
				t.Fatalf("parent link: %v, want one: %v", linked, want)
			}
			if got, want := pagesBytes(t, child), before-int64(tc.inParent*pageSize); got != want {
				t.Fatalf("pages file %d bytes, want %d", got, want)
			}
			leftovers(t, child)
		})
	}
}

func mapsEqual(a, b mem) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// leftovers fails if dir holds a temporary file or a pages file (plain or compressed) no pagemap
// names.
func leftovers(t *testing.T, dir string) {
	t.Helper()
	named, err := criuimage.PagesFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		n := e.Name()
		if _, ok := pagesID(n); (ok && named[strings.TrimSuffix(n, criuimage.CompressedSuffix)] == "") || strings.HasSuffix(n, ".tmp") {
			t.Errorf("%s left over in %s", n, dir)
		}
	}
}

// chain writes three generations g <- p <- c, each a full dump deduplicated against the one
// before: g holds pages 0-7, p changes 2-3, c changes 5 and grows page 8.
func chain(t *testing.T) (root, g, p, c string, want map[string]mem) {
	root = t.TempDir()
	want = map[string]mem{
		"g": seq(mem{}, 0, 8, "abcdefgh"),
		"p": seq(seq(mem{}, 0, 8, "abcdefgh"), 2, 2, "CD"),
		"c": seq(seq(seq(mem{}, 0, 8, "abcdefgh"), 2, 2, "CD"), 5, 4, "FghI"),
	}
	g = writeDump(t, root, "g", want["g"], 1)
	p = writeDump(t, root, "p", want["p"], 1)
	c = writeDump(t, root, "c", want["c"], 1)
	for _, pair := range [][2]string{{p, g}, {c, p}} {
		if _, err := Dedup(pair[0], pair[1]); err != nil {
			t.Fatal(err)
		}
	}
	return root, g, p, c, want
}

func TestChain(t *testing.T) {
	_, g, p, c, want := chain(t)
	for dir, name := range map[string]string{g: "g", p: "p", c: "c"} {
		if got := memory(t, dir); !mapsEqual(got, want[name]) {
			t.Fatalf("%s: memory %v, want %v", name, got, want[name])
		}
	}
	// c stores its changed page 5 and its new page 8: the rest is p's or g's.
	if got := pagesBytes(t, c); got != 2*int64(pageSize) {
		t.Fatalf("c's pages file: %d bytes, want 2 pages", got)
	}
	if _, err := Dedup(c, g); err != nil {
		t.Fatal(err)
	}
	if got := memory(t, c); !mapsEqual(got, want["c"]) {
		t.Fatal("a second Dedup changed a directory that has a parent")
	}
}

func TestRemoveMiddle(t *testing.T) {
	_, g, p, c, want := chain(t)
	children, err := Remove(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(children) != 1 || children[0] != c {
		t.Fatalf("detached %v, want [%s]", children, c)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("p not removed: %v", err)
	}
	if got := memory(t, c); !mapsEqual(got, want["c"]) {
		t.Fatalf("c after removing p: %v, want %v", got, want["c"])
	}
	if parent, err := parentOf(c); err != nil || parent != g {
		t.Fatalf("c's parent %q (%v), want g", parent, err)
	}
	// What c read from p (pages 2 and 3) is c's now; the rest still comes from g.
	if got := pagesBytes(t, c); got != 4*int64(pageSize) {
		t.Fatalf("c's pages file: %d bytes, want 4 pages", got)
	}
	leftovers(t, c)
	if _, err := Remove(g); err != nil {
		t.Fatal(err)
	}
	if got := memory(t, c); !mapsEqual(got, want["c"]) {
		t.Fatalf("c after removing g: %v, want %v", got, want["c"])
	}
	if parent, _ := parentOf(c); parent != "" {
		t.Fatalf("c still has parent %s", parent)
	}
}

// TestChainTooLong: a directory whose parent has MaxChain-1 parents already is not deduplicated
// (admission would refuse a longer chain): it stays a full dump and starts a new chain.
func TestChainTooLong(t *testing.T) {
	root := t.TempDir()
	m := seq(mem{}, 0, 2, "ab")
	prev := writeDump(t, root, "0", m, 1)
	for i := 1; i <= criuimage.MaxChain; i++ {
		dir := writeDump(t, root, fmt.Sprint(i), m, 1)
		_, err := Dedup(dir, prev)
		if i < criuimage.MaxChain && err != nil {
			t.Fatalf("level %d: %v", i, err)
		}
		if i == criuimage.MaxChain {
			if !errors.Is(err, ErrChainTooLong) {
				t.Fatalf("level %d: %v, want ErrChainTooLong", i, err)
			}
			if parent, _ := parentOf(dir); parent != "" || !mapsEqual(memory(t, dir), m) {
				t.Fatalf("level %d was linked (%q) or changed", i, parent)
			}
		}
		prev = dir
	}
	if chain, err := criuimage.Chain(filepath.Join(root, fmt.Sprint(criuimage.MaxChain-1)), root); err != nil || len(chain) != criuimage.MaxChain-1 {
		t.Fatalf("the longest chain: %d parents, %v", len(chain), err)
	}
}

func TestDedupRemovedParent(t *testing.T) {
	root := t.TempDir()
	p := writeDump(t, root, "p", seq(mem{}, 0, 4, "abcd"), 1)
	c := writeDump(t, root, "c", seq(mem{}, 0, 4, "abcd"), 1)
	if err := os.WriteFile(filepath.Join(p, removingMark), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Dedup(c, p); !errors.Is(err, ErrParentRemoved) {
		t.Fatalf("Dedup against a parent being removed: %v", err)
	}
	if parent, _ := parentOf(c); parent != "" {
		t.Fatal("linked to a parent being removed")
	}
}

// TestKilledRewrite leaves what a kill mid-rewrite leaves (a temporary pages file, a renamed new
// pages file no pagemap names yet, a temporary pagemap): the directory restores as it was, and the
// next rewrite sweeps the rest.
func TestKilledRewrite(t *testing.T) {
	root := t.TempDir()
	m := seq(mem{}, 0, 4, "abcd")
	p := writeDump(t, root, "p", m, 1)
	c := writeDump(t, root, "c", m, 1)
	for _, n := range []string{".pages-2.img.tmp", "pages-3.img", ".pagemap-1.img.tmp"} {
		if err := os.WriteFile(filepath.Join(c, n), []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got := memory(t, c); !mapsEqual(got, m) {
		t.Fatalf("memory with leftovers: %v", got)
	}
	if _, err := Dedup(c, p); err != nil {
		t.Fatal(err)
	}
	if got := memory(t, c); !mapsEqual(got, m) {
		t.Fatalf("memory after dedup: %v", got)
	}
	leftovers(t, c)
}

// TestReadLockFIFO: a parent link to a FIFO fails the lock at once (opening a FIFO blocks).
func TestReadLockFIFO(t *testing.T) {
	root := t.TempDir()
	c := writeDump(t, root, "c", seq(mem{}, 0, 1, "a"), 1)
	fifo := filepath.Join(root, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fifo, filepath.Join(c, criuimage.ParentLink)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLock(c); !errors.Is(err, unix.ENOTDIR) {
		t.Fatalf("ReadLock through a link to a FIFO: %v, want ENOTDIR", err)
	}
}

func TestReadLock(t *testing.T) {
	_, g, p, c, _ := chain(t)
	l, err := ReadLock(c)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l.Dirs, []string{c, p, g}) {
		t.Fatalf("locked %v, want c, p, g", l.Dirs)
	}
	// A rewrite (exclusive) of any directory of the chain must wait while it is read.
	for _, d := range l.Dirs {
		if f, err := lockDir(d, unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
			if f != nil {
				f.Close()
			}
			t.Fatalf("%s locked exclusively while read-locked: %v", d, err)
		}
	}
	l.Unlock()
	f, err := lockDir(c, unix.LOCK_EX|unix.LOCK_NB)
	if err != nil {
		t.Fatalf("after Unlock: %v", err)
	}
	f.Close()
}

// TestKilledDedup kills a Dedup (in a child process) with SIGKILL once it has reached a stage
// (its new pages file being written; the parent link made) and checks the directory restores
// exactly as before, and that the next Dedup finishes the job and sweeps what the kill left.
func TestKilledDedup(t *testing.T) {
	if dir := os.Getenv("PAGECHAIN_DEDUP_CHILD"); dir != "" {
		if _, err := Dedup(dir, os.Getenv("PAGECHAIN_DEDUP_PARENT")); err != nil {
			t.Fatal(err)
		}
		return
	}
	// 8192 pages, one in 64 changed: the rewrite takes long enough to be caught mid-way.
	parentMem, childMem := mem{}, mem{}
	for i := 0; i < 8192; i++ {
		parentMem[addr(i)] = string(rune('a' + i%26))
		childMem[addr(i)] = parentMem[addr(i)]
		if i%64 == 0 {
			childMem[addr(i)] = strings.ToUpper(childMem[addr(i)])
		}
	}
	for _, stage := range []string{".pages-2.img.tmp", criuimage.ParentLink} {
		t.Run(stage, func(t *testing.T) {
			root := t.TempDir()
			p := writeDump(t, root, "p", parentMem, 1)
			c := writeDump(t, root, "c", childMem, 1)
			cmd := exec.Command(os.Args[0], "-test.run=^TestKilledDedup$")
			cmd.Env = append(os.Environ(), "PAGECHAIN_DEDUP_CHILD="+c, "PAGECHAIN_DEDUP_PARENT="+p)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			reached := false
			for !reached {
				_, err := os.Lstat(filepath.Join(c, stage))
				reached = err == nil
				if !reached && cmd.ProcessState == nil {
					if wait := waitNoHang(cmd.Process.Pid); wait {
						break // done before the stage was seen: still a state to check
					}
				}
			}
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Logf("killed at %s: stage seen %v", stage, reached)
			if got := memory(t, c); !mapsEqual(got, childMem) {
				t.Fatal("memory after a killed Dedup differs from the dump's")
			}
			if _, err := Dedup(c, p); err != nil {
				t.Fatal(err)
			}
			if got := memory(t, c); !mapsEqual(got, childMem) {
				t.Fatal("memory after a Dedup following a killed one differs from the dump's")
			}
			leftovers(t, c)
		})
	}
}

// waitNoHang reports whether process pid has exited (without reaping it).
func waitNoHang(pid int) bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	return err == nil && info.Signo != 0
}
