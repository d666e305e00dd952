package diff

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/containerd/v2/pkg/rootfs"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/containerd/v2/plugins/diff/walking"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"
)

// env is containerd's overlay snapshotter (cklite's on-disk layout) under a
// temporary root, a local content store, and both differs over them.
type env struct {
	root    string
	sn      snapshots.Snapshotter
	store   content.Store
	fast    *Differ
	walking diff.Comparer
}

func newEnv(tb testing.TB) *env {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root to mount overlayfs")
	}
	root := tb.TempDir()
	sn, err := overlay.NewSnapshotter(root)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { sn.Close() })
	// Labels make the store behave as containerd's metadata store does
	// for the uncompressed digest label.
	store, err := local.NewLabeledStore(tb.TempDir(), labelStore{})
	if err != nil {
		tb.Fatal(err)
	}
	return &env{root: root, sn: sn, store: store, fast: New(root, store), walking: walking.NewWalkingDiff(store)}
}

// commit creates the committed snapshot name on parent with populate run
// directly on its directory, like an unpacked image layer.
func (e *env) commit(tb testing.TB, name, parent string, populate func(dir string)) {
	tb.Helper()
	ctx := context.Background()
	mounts, err := e.sn.Prepare(ctx, name+"-unpack", parent)
	if err != nil {
		tb.Fatal(err)
	}
	withMounted(tb, mounts, populate)
	if err := e.sn.Commit(ctx, name, name+"-unpack"); err != nil {
		tb.Fatal(err)
	}
}

// active prepares the active snapshot key on parent and makes change through
// a real mount of it, which stays mounted like a running container's rootfs.
// It returns the mounts rootfs.CreateDiff passes to the differ for key.
func (e *env) active(tb testing.TB, key, parent string, change func(dir string)) (lower, upper []mount.Mount) {
	tb.Helper()
	ctx := context.Background()
	upper, err := e.sn.Prepare(ctx, key, parent)
	if err != nil {
		tb.Fatal(err)
	}
	target := tb.TempDir()
	if err := mount.All(upper, target); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { mount.UnmountAll(target, 0) })
	change(target)
	// As rootfs.CreateDiff does, even for the parent "".
	if lower, err = e.sn.View(ctx, key+"-parent", parent); err != nil {
		tb.Fatal(err)
	}
	return lower, upper
}

func withMounted(tb testing.TB, mounts []mount.Mount, f func(dir string)) {
	tb.Helper()
	if err := mount.WithTempMount(context.Background(), mounts, func(dir string) error {
		f(dir)
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
}

// fsOps fails the test on the first error of a sequence of file operations.
type fsOps struct {
	tb  testing.TB
	dir string
}

func (o fsOps) p(name string) string { return filepath.Join(o.dir, name) }

func (o fsOps) check(err error) {
	o.tb.Helper()
	if err != nil {
		o.tb.Fatal(err)
	}
}

func (o fsOps) write(name, data string, mode os.FileMode) {
	o.tb.Helper()
	o.check(os.MkdirAll(filepath.Dir(o.p(name)), 0o755))
	o.check(os.WriteFile(o.p(name), []byte(data), mode))
	o.check(os.Chmod(o.p(name), mode))
}

func (o fsOps) mkdir(name string) {
	o.tb.Helper()
	o.check(os.MkdirAll(o.p(name), 0o755))
}

func (o fsOps) removeAll(name string) {
	o.tb.Helper()
	o.check(os.RemoveAll(o.p(name)))
}

// vfsCapV2 is a security.capability value granting CAP_NET_BIND_SERVICE
// (bit 10) effective and permitted.
func vfsCapV2() []byte {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000000|1)
	binary.LittleEndian.PutUint32(b[4:], 1<<10)
	return b
}

// populateBase writes files, directories, symlinks, hardlinks, owners and
// xattrs that the changes below touch.
func populateBase(tb testing.TB, dir string) {
	o := fsOps{tb, dir}
	o.write("etc/hosts", "127.0.0.1 localhost\n", 0o644)
	o.write("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644)
	o.write("etc/removeme", "bye\n", 0o600)
	o.write("bin/tool", "#!/bin/sh\necho tool\n", 0o755)
	o.check(unix.Setxattr(o.p("bin/tool"), "security.capability", vfsCapV2(), 0))
	o.check(unix.Setxattr(o.p("bin/tool"), "user.note", []byte("kept out of tars"), 0))
	o.write("home/user/owned", "mine\n", 0o640)
	o.check(os.Chown(o.p("home/user/owned"), 1000, 1000))
	o.check(os.Chown(o.p("home/user"), 1000, 1000))
	o.write("var/cache/a/1", "1", 0o644)
	o.write("var/cache/b", "2", 0o644)
	o.write("var/log/keep", "log\n", 0o644)
	o.write("opq/a", "a", 0o644)
	o.write("opq/sub/b", "b", 0o644)
	o.write("f2d", "file becoming a dir", 0o644)
	o.write("d2f/inner/x", "x", 0o644)
	o.write("hl/a", "linked", 0o644)
	o.check(os.Link(o.p("hl/a"), o.p("hl/b")))
	o.check(os.Symlink("etc/hosts", o.p("lnk")))
	o.check(os.Symlink("/nowhere", o.p("dangling")))
}

// changeActive makes every kind of change a container can make.
func changeActive(tb testing.TB, dir string) {
	o := fsOps{tb, dir}
	o.write("newdir/new.txt", "created\n", 0o644)
	o.write("etc/added", "added\n", 0o600)
	o.write("etc/hosts", "127.0.0.1 localhost cklite\n", 0o644)
	o.check(os.Chmod(o.p("bin/tool"), 0o700))
	o.check(os.Chown(o.p("home/user/owned"), 1001, 1002))
	o.check(os.Remove(o.p("etc/removeme")))
	o.removeAll("var/cache")
	o.removeAll("opq")
	o.mkdir("opq")
	o.write("opq/c", "c", 0o644)
	o.check(os.Remove(o.p("f2d")))
	o.write("f2d/inner", "inside", 0o644)
	o.removeAll("d2f")
	o.write("d2f", "dir became a file", 0o644)
	o.write("hl/a", "relinked", 0o644) // copy-up breaks the link to hl/b
	o.check(os.Link(o.p("etc/passwd"), o.p("etc/passwd.link")))
	o.write("newdir/x", "pair", 0o644)
	o.check(os.Link(o.p("newdir/x"), o.p("newdir/y")))
	o.check(os.Remove(o.p("lnk")))
	o.check(os.Symlink("etc/added", o.p("lnk")))
	o.check(os.Symlink("../etc/hosts", o.p("newdir/link")))
	o.check(unix.Mkfifo(o.p("newdir/fifo"), 0o600))
	o.check(os.Remove(o.p("dangling")))
}

// entry is what a layer tar says about one path.
type entry struct {
	Typeflag byte
	Mode     int64
	UID, GID int
	Size     int64
	Linkname string
	ModTime  time.Time
	Content  digest.Digest
	Xattrs   string
	// Links names every path of a hardlinked file, however the tar
	// chose which of them carries the data.
	Links string
}

// layerTar returns the uncompressed tar of the layer desc in store.
func layerTar(tb testing.TB, store content.Store, desc ocispec.Descriptor) []byte {
	tb.Helper()
	ra, err := store.ReaderAt(context.Background(), desc)
	if err != nil {
		tb.Fatal(err)
	}
	defer ra.Close()
	r, err := compression.DecompressStream(content.NewReader(ra))
	if err != nil {
		tb.Fatal(err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// readLayer reads the layer desc from store into a map by path; should a
// path appear twice, the last header wins, as when the layer is applied.
func readLayer(tb testing.TB, store content.Store, desc ocispec.Descriptor) map[string]entry {
	tb.Helper()
	entries := map[string]entry{}
	tr := tar.NewReader(bytes.NewReader(layerTar(tb, store, desc)))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			tb.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			tb.Fatal(err)
		}
		var xattrs []string
		for k, v := range hdr.PAXRecords {
			if strings.HasPrefix(k, "SCHILY.xattr.") {
				xattrs = append(xattrs, k+"="+v)
			}
		}
		sort.Strings(xattrs)
		entries[strings.TrimSuffix(hdr.Name, "/")] = entry{
			Typeflag: hdr.Typeflag, Mode: hdr.Mode, UID: hdr.Uid, GID: hdr.Gid,
			Size: hdr.Size, Linkname: hdr.Linkname, ModTime: hdr.ModTime,
			Content: digest.FromBytes(data), Xattrs: strings.Join(xattrs, ","),
		}
	}
	normalizeLinks(entries)
	return entries
}

// normalizeLinks rewrites every member of a hardlink set as the member that
// carries the data, annotated with the whole set: the walking differ makes
// the first path it meets in a changed set the data carrier, the fast path
// the first changed one.
func normalizeLinks(entries map[string]entry) {
	sets := map[string][]string{}
	for name, e := range entries {
		if e.Typeflag == tar.TypeLink {
			sets[e.Linkname] = append(sets[e.Linkname], name)
		}
	}
	for carrier, links := range sets {
		members := append([]string{carrier}, links...)
		sort.Strings(members)
		e := entries[carrier]
		e.Links = strings.Join(members, ",")
		for _, m := range members {
			entries[m] = e
		}
	}
}

// expandOpaque rewrites the fast path's opaque markers as the walking
// differ states the same change: one whiteout per child the lower directory
// had that the layer does not recreate. The marker of a directory that
// replaces a non-directory stands for nothing and goes.
func expandOpaque(tb testing.TB, entries map[string]entry, lower []mount.Mount) {
	tb.Helper()
	for name := range entries {
		dir, ok := strings.CutSuffix(name, "/.wh..wh..opq")
		if !ok {
			continue
		}
		delete(entries, name)
		withMounted(tb, lower, func(base string) {
			children, err := os.ReadDir(filepath.Join(base, dir))
			if err != nil && !errors.Is(err, unix.ENOTDIR) {
				tb.Fatal(err)
			}
			for _, c := range children {
				if _, recreated := entries[path.Join(dir, c.Name())]; !recreated {
					entries[path.Join(dir, ".wh."+c.Name())] = entry{Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Content: digest.FromBytes(nil)}
				}
			}
		})
	}
}

func compareLayers(tb testing.TB, fast, walk map[string]entry) {
	tb.Helper()
	for name, w := range walk {
		f, ok := fast[name]
		switch {
		case !ok:
			tb.Errorf("%s: only in walking's diff: %+v", name, w)
		case f.Typeflag == tar.TypeDir && w.Typeflag == tar.TypeDir:
			// A directory's tar header records no content, so compare
			// everything but the (zero) size and content digest.
			f.Size, w.Size = 0, 0
			fallthrough
		default:
			if f != w {
				tb.Errorf("%s differs:\n fast    %+v\n walking %+v", name, f, w)
			}
		}
	}
	for name, f := range fast {
		if _, ok := walk[name]; !ok {
			tb.Errorf("%s: only in the fast diff: %+v", name, f)
		}
	}
}

func TestCompareMatchesWalking(t *testing.T) {
	for _, tc := range []struct {
		name string
		// parents are committed bottom-up, each holding part of the base.
		parents []func(tb testing.TB, dir string)
		change  func(tb testing.TB, dir string)
		opts    []diff.Opt
	}{
		{
			name:    "one lower layer (bind lower)",
			parents: []func(testing.TB, string){populateBase},
			change:  changeActive,
		},
		{
			name: "two lower layers (overlay lower)",
			parents: []func(testing.TB, string){
				func(tb testing.TB, dir string) { fsOps{tb, dir}.write("early/file", "from the bottom layer", 0o644) },
				populateBase,
			},
			change: func(tb testing.TB, dir string) {
				changeActive(tb, dir)
				fsOps{tb, dir}.removeAll("early")
			},
		},
		{
			name: "no parent (bind upper)",
			change: func(tb testing.TB, dir string) {
				populateBase(tb, dir)
				fsOps{tb, dir}.write("tmp/extra", "x", 0o644)
			},
		},
		{
			name:    "uncompressed with source date epoch",
			parents: []func(testing.TB, string){populateBase},
			change:  changeActive,
			opts: []diff.Opt{
				diff.WithMediaType(ocispec.MediaTypeImageLayer),
				diff.WithSourceDateEpoch(&time.Time{}),
			},
		},
		{
			name:    "zstd",
			parents: []func(testing.TB, string){populateBase},
			change:  changeActive,
			opts:    []diff.Opt{diff.WithMediaType(ocispec.MediaTypeImageLayerZstd)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			parent := ""
			for i, populate := range tc.parents {
				name := "layer" + string(rune('0'+i))
				e.commit(t, name, parent, func(dir string) { populate(t, dir) })
				parent = name
			}
			lower, _ := e.active(t, "active", parent, func(dir string) { tc.change(t, dir) })
			ctx := context.Background()

			// Through the client's own checkpoint path.
			fastDesc, err := rootfs.CreateDiff(ctx, "active", e.sn, e.fast, tc.opts...)
			if err != nil {
				t.Fatalf("fast Compare: %v", err)
			}
			walkDesc, err := rootfs.CreateDiff(ctx, "active", e.sn, e.walking, tc.opts...)
			if err != nil {
				t.Fatalf("walking Compare: %v", err)
			}
			if fastDesc.MediaType != walkDesc.MediaType {
				t.Errorf("media type %s, walking %s", fastDesc.MediaType, walkDesc.MediaType)
			}
			checkLabels(t, e.store, fastDesc)

			fast, walk := readLayer(t, e.store, fastDesc), readLayer(t, e.store, walkDesc)
			expandOpaque(t, fast, lower)
			compareLayers(t, fast, walk)
			if t.Failed() {
				t.Logf("fast: %v\nwalking: %v", keys(fast), keys(walk))
			}
		})
	}
}

// checkLabels checks the uncompressed digest label walking sets on a
// compressed blob.
func checkLabels(tb testing.TB, store content.Store, desc ocispec.Descriptor) {
	tb.Helper()
	ctx := context.Background()
	info, err := store.Info(ctx, desc.Digest)
	if err != nil {
		tb.Fatal(err)
	}
	if desc.MediaType == ocispec.MediaTypeImageLayer {
		return
	}
	want := digest.FromBytes(layerTar(tb, store, desc))
	if got := info.Labels[labels.LabelUncompressed]; got != want.String() {
		tb.Errorf("uncompressed label %q, want %q", got, want)
	}
}

func keys(m map[string]entry) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func TestCompareFallsThrough(t *testing.T) {
	e := newEnv(t)
	e.commit(t, "base", "", func(dir string) { populateBase(t, dir) })
	e.commit(t, "base2", "base", func(dir string) { fsOps{t, dir}.write("two", "2", 0o644) })
	lower, upper := e.active(t, "active", "base", func(dir string) { changeActive(t, dir) })
	lower2, upper2 := e.active(t, "active2", "base2", func(dir string) { fsOps{t, dir}.write("three", "3", 0o644) })
	_, upper3 := e.active(t, "active3", "base2", func(dir string) { fsOps{t, dir}.write("four", "4", 0o644) })
	_, noParent := e.active(t, "orphan", "", func(dir string) { fsOps{t, dir}.write("one", "1", 0o644) })

	// The same snapshots seen by a differ of another snapshotter root.
	elsewhere := New(t.TempDir(), e.store)
	// An upper whose upperdir holds a metacopy file: its data lives below.
	_, metacopy := e.active(t, "metacopy", "base", func(dir string) { fsOps{t, dir}.write("etc/hosts", "x", 0o644) })
	metacopyUpper := upperDirOf(t, metacopy)
	if err := unix.Setxattr(filepath.Join(metacopyUpper, "etc/hosts"), "trusted.overlay.metacopy", nil, 0); err != nil {
		t.Fatal(err)
	}

	tmpfs := []mount.Mount{{Type: "tmpfs", Source: "tmpfs", Options: []string{"rw"}}}
	idmapped := []mount.Mount{upper[0]}
	idmapped[0].Options = append([]string{"uidmap=0:1000:65536"}, upper[0].Options...)
	for _, tc := range []struct {
		name         string
		d            *Differ
		lower, upper []mount.Mount
		opts         []diff.Opt
		// why is part of the error, to tell which check refused.
		why string
	}{
		{name: "another snapshotter root", d: elsewhere, lower: lower, upper: upper, why: "is not under"},
		{name: "tmpfs upper", d: e.fast, lower: lower, upper: tmpfs, why: `type "tmpfs"`},
		{name: "view as upper", d: e.fast, upper: lower, why: "read-only bind upper"},
		{name: "lower of another active", d: e.fast, lower: lower2, upper: upper, why: "other lowerdirs"},
		{name: "lower is an active on the parent", d: e.fast, lower: upper3, upper: upper2, why: "upperdir of its own"},
		{name: "lower is not the parent", d: e.fast, lower: lower, upper: upper2, why: "is not the upper's lowerdir"},
		{name: "missing lower", d: e.fast, upper: upper, why: "no lower mount"},
		{name: "lower for an upper without parent", d: e.fast, lower: lower, upper: noParent, why: "is not empty"},
		{name: "idmapped upper", d: e.fast, lower: lower, upper: idmapped, why: "idmapped"},
		{name: "metacopy in upperdir", d: e.fast, lower: lower, upper: metacopy, why: "overlay.metacopy"},
		{name: "unsupported media type", d: e.fast, lower: lower, upper: upper, opts: []diff.Opt{diff.WithMediaType("application/x-cklite")}, why: "unsupported diff media type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.d.Compare(context.Background(), tc.lower, tc.upper, tc.opts...)
			if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("Compare: %v, want NotImplemented for %q", err, tc.why)
			}
		})
	}
	// A fall-through mid-walk must not leave an upload behind.
	statuses, err := e.store.ListStatuses(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(statuses) != 0 {
		t.Errorf("uploads left behind: %+v", statuses)
	}

	if _, err := e.fast.Apply(context.Background(), ocispec.Descriptor{}, upper); !errdefs.IsNotImplemented(err) {
		t.Errorf("Apply: %v, want NotImplemented", err)
	}
}

func upperDirOf(tb testing.TB, upper []mount.Mount) string {
	tb.Helper()
	for _, o := range upper[0].Options {
		if dir, ok := strings.CutPrefix(o, "upperdir="); ok {
			return dir
		}
	}
	tb.Fatalf("no upperdir in %+v", upper)
	return ""
}

// labelStore keeps content labels in memory for local.NewLabeledStore.
type labelStore map[digest.Digest]map[string]string

func (s labelStore) Get(d digest.Digest) (map[string]string, error) {
	return maps.Clone(s[d]), nil
}

func (s labelStore) Set(d digest.Digest, labels map[string]string) error {
	s[d] = maps.Clone(labels)
	return nil
}

func (s labelStore) Update(d digest.Digest, update map[string]string) (map[string]string, error) {
	labels := s[d]
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range update {
		if v == "" {
			delete(labels, k)
		} else {
			labels[k] = v
		}
	}
	s[d] = labels
	return maps.Clone(labels), nil
}
