package criuimage

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/encoding/protowire"
)

// msg builds a protobuf message from (field, value) pairs: uint32/uint64/bool as varints,
// string and []byte as bytes, []uint32 as unpacked repeated varints.
func msg(kv ...any) []byte {
	var b []byte
	for i := 0; i < len(kv); i += 2 {
		num := protowire.Number(kv[i].(int))
		switch v := kv[i+1].(type) {
		case int:
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(v))
		case bool:
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, protowire.EncodeBool(v))
		case string:
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendString(b, v)
		case []byte:
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendBytes(b, v)
		case []uint32:
			for _, x := range v {
				b = protowire.AppendTag(b, num, protowire.VarintType)
				b = protowire.AppendVarint(b, uint64(x))
			}
		default:
			panic("msg: unsupported value")
		}
	}
	return b
}

// image encodes entries as a CRIU image with magic.
func image(magic uint32, entries ...[]byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, magicCommon)
	b = binary.LittleEndian.AppendUint32(b, magic)
	for _, e := range entries {
		b = append(b, entry(e)...)
	}
	return b
}

// entry is one entry of an image: its size, then its bytes.
func entry(e []byte) []byte {
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(e))), e...)
}

const (
	capChown     = 0
	capSetgid    = 6
	capSetuid    = 7
	capSysAdmin  = 21
	capNetRaw    = 13
	defaultPages = 3
)

// creds are a process's credentials: uid/gid 0, capabilities caps (a mask) in every set.
func creds(uid int, caps uint64) []byte {
	lo, hi := uint32(caps), uint32(caps>>32)
	return msg(1, uid, 2, 0, 3, uid, 4, 0, 5, uid, 6, 0, 7, uid, 8, 0,
		9, []uint32{0, 0}, 10, []uint32{lo, hi}, 11, []uint32{lo, hi}, 12, []uint32{lo, hi}, 13, 0)
}

// fixture is the image directory of one process, pid 1, with the given parts.
type fixture struct {
	creds   []byte
	seccomp int
	ids     []byte // task ids of pid 1
	mounts  [][]byte
	pages   int  // bytes in pages-1.img
	zombie  bool // pid 2, an exited child: no memory, a thread id CRIU never filled in
}

func (f fixture) write(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	hostIDs := msg(1, 1, 2, 1, 3, 1, 4, 1, 5, 100, 6, 101, 9, 104)
	files := map[string][]byte{
		"inventory.img": image(magicInventory, msg(1, 2, 3, hostIDs)),
		"pstree.img":    image(magicPstree, msg(1, 1, 2, 0, 3, 1, 4, 1, 5, []uint32{1})),
		"core-1.img": image(magicCore, msg(1, 1, 3, msg(1, 1, 2, 0, 3, 0, 4, 0, 5, 0, 6, "sh"), 4, f.ids,
			5, msg(1, 0, 2, 0, 10, f.creds, 11, f.seccomp))),
		"pagemap-1.img":     image(magicPagemap, msg(1, 1), msg(1, 0x400000, 2, 0, 4, PagePresent, 5, 2), msg(1, 0x500000, 2, 1, 4, PagePresent), msg(1, 0x600000, 2, 0, 4, 0, 5, 5)),
		"pages-1.img":       make([]byte, f.pages),
		"mountpoints-9.img": image(magicMnts, f.mounts...),
	}
	if f.zombie {
		files["pstree.img"] = append(files["pstree.img"], entry(msg(1, 2, 2, 1, 3, 1, 4, 1, 5, []uint32{3797684976}))...)
		// A zombie's core has its task state, no thread core (so no credentials).
		files["core-2.img"] = image(magicCore, msg(1, 1, 3, msg(1, 2, 2, 0, 3, 0, 4, 0, 5, 0, 6, "sh")))
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func mnt(id, parent, fstype, dev int, mp, source string, ext ...string) []byte {
	b := msg(1, fstype, 2, id, 3, dev, 4, parent, 5, 0, 6, "/", 7, mp, 8, source, 9, "")
	if len(ext) > 0 {
		b = append(b, msg(13, true, 18, ext[0])...)
	}
	return b
}

func TestAdmit(t *testing.T) {
	page := os.Getpagesize()
	bounding := []string{"CAP_CHOWN", "CAP_SETUID", "CAP_SETGID", "CAP_NET_RAW"}
	const specCaps = 1<<capChown | 1<<capSetuid | 1<<capSetgid | 1<<capNetRaw
	spec := func() *specs.Spec {
		return &specs.Spec{
			Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: bounding}},
			Mounts: []specs.Mount{
				{Destination: "/proc", Type: "proc"},
				{Destination: "/sys/fs/cgroup", Type: "cgroup"},
				{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/nerdctl/hosts", Options: []string{"rbind"}},
			},
			Linux: &specs.Linux{
				Namespaces:  []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}},
				MaskedPaths: []string{"/proc/kcore"},
			},
		}
	}
	goodMounts := [][]byte{
		mnt(10, 1, 17, 50, "/", "overlay"),
		mnt(11, 10, fsProc, 4, "/proc", "proc"),
		mnt(12, 11, 3, 6, "/proc/kcore", "devtmpfs", "/dev/null"),
		mnt(13, 10, fsTmpfs, 61, "/sys/fs/cgroup", "tmpfs"),
		mnt(14, 13, fsCgroup, 62, "/sys/fs/cgroup/memory", "cgroup"),
		mnt(15, 10, 0, 8, "/etc/hosts", "/dev/vda1", "/etc/hosts"),
	}
	good := fixture{creds: creds(0, specCaps), ids: msg(1, 2, 2, 2, 3, 2, 4, 2, 5, 200, 6, 201, 9, 204), mounts: goodMounts, pages: defaultPages * page}
	for _, tc := range []struct {
		name   string
		change func(f *fixture, s *specs.Spec)
		kind   func(error) bool // nil: admitted
		reason string
	}{
		{name: "as dumped", change: func(*fixture, *specs.Spec) {}},
		{name: "pages truncated", change: func(f *fixture, _ *specs.Spec) { f.pages = defaultPages*page - 1 }, kind: errdefs.IsInvalidArgument, reason: "truncated"},
		{name: "pages empty", change: func(f *fixture, _ *specs.Spec) { f.pages = 0 }, kind: errdefs.IsInvalidArgument, reason: "pages-1.img is 0 bytes"},
		{name: "pages padded", change: func(f *fixture, _ *specs.Spec) { f.pages = (defaultPages + 1) * page }, kind: errdefs.IsInvalidArgument, reason: "padded"},
		{name: "capability raised", change: func(f *fixture, _ *specs.Spec) { f.creds = creds(0, specCaps|1<<capSysAdmin) },
			kind: errdefs.IsPermissionDenied, reason: "CAP_SYS_ADMIN beyond the spec's bounding set"},
		{name: "zombie child", change: func(f *fixture, _ *specs.Spec) { f.zombie = true }},
		{name: "capabilities dropped", change: func(f *fixture, _ *specs.Spec) { f.creds = creds(0, 1<<capChown) }},
		{name: "other uid with CAP_SETUID", change: func(f *fixture, _ *specs.Spec) { f.creds = creds(1000, specCaps) }},
		{name: "other uid without CAP_SETUID", change: func(f *fixture, s *specs.Spec) {
			s.Process.Capabilities.Bounding = []string{"CAP_CHOWN"}
			f.creds = creds(0, 1<<capChown)
			s.Process.User.UID = 1000
		}, kind: errdefs.IsPermissionDenied, reason: "uid 0, the spec runs uid 1000"},
		{name: "no seccomp where the spec has a filter", change: func(_ *fixture, s *specs.Spec) { s.Linux.Seccomp = &specs.LinuxSeccomp{} },
			kind: errdefs.IsPermissionDenied, reason: "seccomp mode 0"},
		{name: "seccomp filter", change: func(f *fixture, s *specs.Spec) { s.Linux.Seccomp = &specs.LinuxSeccomp{}; f.seccomp = 2 }},
		{name: "host's mount namespace", change: func(f *fixture, _ *specs.Spec) { f.ids = msg(1, 2, 2, 2, 3, 2, 4, 2, 5, 200, 6, 201, 9, 104) },
			kind: errdefs.IsPermissionDenied, reason: "host's mount namespace"},
		{name: "host disk mounted", change: func(f *fixture, _ *specs.Spec) {
			f.mounts = append(goodMounts, mnt(16, 11, fsAuto, 8, "/proc/host", "/dev/vda1"))
		}, kind: errdefs.IsPermissionDenied, reason: "mount /proc/host"},
		{name: "mount outside the spec", change: func(f *fixture, _ *specs.Spec) {
			f.mounts = append(goodMounts, mnt(16, 10, fsSysfs, 70, "/host", "sysfs"))
		}, kind: errdefs.IsPermissionDenied, reason: "not a mount of the container's spec"},
		{name: "tmpfs outside the spec", change: func(f *fixture, _ *specs.Spec) {
			f.mounts = append(goodMounts, mnt(16, 10, fsTmpfs, 70, "/run", "tmpfs"))
		}},
		{name: "external mount not in the spec", change: func(f *fixture, _ *specs.Spec) {
			f.mounts = append(goodMounts[:5:5], mnt(15, 10, 0, 8, "/etc/hosts", "/dev/vda1", "/etc/shadow"))
		}, kind: errdefs.IsPermissionDenied, reason: "external mount \"/etc/shadow\""},
		{name: "cgroup v1 hierarchy as libcontainer's external mount", change: func(f *fixture, _ *specs.Spec) {
			f.mounts = append(goodMounts, mnt(16, 13, fsCgroup, 63, "/sys/fs/cgroup/systemd", "cgroup", "/sys/fs/cgroup/systemd"))
		}},
		{name: "external tmpfs below the cgroup mount", change: func(f *fixture, _ *specs.Spec) {
			f.mounts = append(goodMounts, mnt(16, 13, fsTmpfs, 63, "/sys/fs/cgroup/x", "tmpfs", "/sys/fs/cgroup/x"))
		}, kind: errdefs.IsPermissionDenied, reason: "external mount \"/sys/fs/cgroup/x\""},
		{name: "cgroup below the cgroup mount keyed elsewhere", change: func(f *fixture, _ *specs.Spec) {
			f.mounts = append(goodMounts, mnt(16, 13, fsCgroup, 63, "/sys/fs/cgroup/x", "cgroup", "/sys/fs/cgroup/memory"))
		}, kind: errdefs.IsPermissionDenied, reason: "external mount \"/sys/fs/cgroup/memory\""},
		{name: "/dev/null over a path the spec does not mask", change: func(f *fixture, _ *specs.Spec) {
			f.mounts = append(goodMounts, mnt(16, 11, 3, 6, "/proc/sysrq-trigger", "devtmpfs", "/dev/null"))
		}},
		{name: "bind from the rootfs", change: func(f *fixture, s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: "/srv"})
			f.mounts = append(goodMounts, mnt(16, 10, 17, 50, "/data", "overlay"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, s := good, spec()
			tc.change(&f, s)
			err := Admit(f.write(t), s)
			if tc.kind == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !tc.kind(err) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("error %v, want one of the expected kind naming %q", err, tc.reason)
			}
		})
	}
}

func TestSplitImage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		b       []byte
		entries int
		wantErr string
	}{
		{name: "empty file", b: nil, wantErr: "too short"},
		{name: "wrong magic", b: image(magicCore, msg(1, 1)), wantErr: "magic"},
		{name: "one entry", b: image(magicPstree, msg(1, 1)), entries: 1},
		{name: "no image-set magic", b: image(magicPstree, msg(1, 1))[4:], entries: 1},
		{name: "truncated entry", b: image(magicPstree, msg(1, 1, 6, "abc"))[:14], wantErr: "truncated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es, err := splitImage("x.img", tc.b, magicPstree)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(es) != tc.entries {
				t.Fatalf("%d entries, %v; want %d", len(es), err, tc.entries)
			}
		})
	}
}

func TestReadMissing(t *testing.T) {
	_, err := Read(t.TempDir())
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("empty directory: %v, want not exist", err)
	}
}

func TestAdmitChain(t *testing.T) {
	page := uint64(os.Getpagesize())
	spec := &specs.Spec{Process: &specs.Process{}}
	run := func(vaddr, pages uint64, flags uint32) PageRun {
		return PageRun{Vaddr: vaddr, Pages: pages, Flags: flags}
	}
	// The child holds page 0x400000 and reads 0x401000-0x402fff from its parent.
	child := PagemapFile{PagesID: 3, Runs: []PageRun{run(0x400000, 1, PagePresent), run(0x401000, 2, PageParent)}}
	parent := PagemapFile{PagesID: 1, Runs: []PageRun{run(0x400000, 3, PagePresent)}}
	write := func(t *testing.T, dir string, pm PagemapFile, pages uint64) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, b := range map[string][]byte{"pagemap-1.img": pm.Encode(), pm.PagesName(): make([]byte, pages*page)} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, root, dir, pdir string) // after the good chain is written
		under   bool                                       // ParentsUnder(root)
		wantErr string
	}{
		{name: "parent below the root", under: true},
		{name: "no root given", wantErr: "an image from elsewhere may not have one"},
		{name: "parent outside the root", under: true, setup: func(t *testing.T, root, dir, pdir string) {
			out := t.TempDir()
			write(t, out, parent, 3)
			relink(t, dir, out)
		}, wantErr: "is not below"},
		{name: "parent lacks a page", under: true, setup: func(t *testing.T, root, dir, pdir string) {
			write(t, pdir, PagemapFile{PagesID: 1, Runs: []PageRun{run(0x400000, 2, PagePresent)}}, 2)
		}, wantErr: "page 0x402000 is in no pagemap run of the parent"},
		{name: "parent's pages truncated", under: true, setup: func(t *testing.T, root, dir, pdir string) {
			if err := os.Truncate(filepath.Join(pdir, "pages-1.img"), int64(page)); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "truncated or padded"},
		{name: "parent without a pagemap for the process", under: true, setup: func(t *testing.T, root, dir, pdir string) {
			os.Remove(filepath.Join(pdir, "pagemap-1.img"))
		}, wantErr: "which has no pagemap for it"},
		{name: "parent link is a directory", under: true, setup: func(t *testing.T, root, dir, pdir string) {
			os.Remove(filepath.Join(dir, ParentLink))
			write(t, filepath.Join(dir, ParentLink), parent, 3)
		}, wantErr: "is not a symbolic link"},
		{name: "parent link to a FIFO", under: true, setup: func(t *testing.T, root, dir, pdir string) {
			fifo := filepath.Join(root, "fifo")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			relink(t, dir, fifo)
		}, wantErr: "is not a directory"},
		{name: "chain loops", under: true, setup: func(t *testing.T, root, dir, pdir string) {
			if err := os.Symlink(dir, filepath.Join(pdir, ParentLink)); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "loop"},
		{name: "pages in parent without a link", under: true, setup: func(t *testing.T, root, dir, pdir string) {
			os.Remove(filepath.Join(dir, ParentLink))
		}, wantErr: "it has none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			f := fixture{creds: creds(0, 0), pages: int(page)}
			dir := filepath.Join(root, "child")
			if err := os.Rename(f.write(t), dir); err != nil {
				t.Fatal(err)
			}
			os.Remove(filepath.Join(dir, "pages-1.img"))
			write(t, dir, child, 1)
			pdir := filepath.Join(root, "parent")
			write(t, pdir, parent, 3)
			relink(t, dir, pdir)
			if tc.setup != nil {
				tc.setup(t, root, dir, pdir)
			}
			var opts []AdmitOption
			if tc.under {
				opts = append(opts, ParentsUnder(root))
			}
			err := Admit(dir, spec, opts...)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want an invalid-argument error naming %q", err, tc.wantErr)
			}
		})
	}
}

// relink points dir's parent link at target, relative as cklite makes it.
func relink(t *testing.T, dir, target string) {
	t.Helper()
	rel, err := filepath.Rel(dir, target)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, ParentLink))
	if err := os.Symlink(rel, filepath.Join(dir, ParentLink)); err != nil {
		t.Fatal(err)
	}
}

// TestMountsResolvedInRootfs: the kubelet's bind mount at /var/run/secrets/sa, in a rootfs whose
// /var/run links to /run, is in CRIU's image at /run/secrets/sa (libcontainer keys it so):
// admitted with the destinations resolved in the rootfs, refused with them as written; an
// absolute symlink resolves inside the rootfs, as libcontainer resolves it (the container's
// /etc, not the host's).
func TestMountsResolvedInRootfs(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "run", "secrets", "sa"), 0o755); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"var/run": "../run", "escape": "/etc"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(rootfs, link)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(rootfs, link)); err != nil {
			t.Fatal(err)
		}
	}
	root := Mount{ID: 10, Parent: 1, Mountpoint: "/", RootDev: 50}
	for _, tc := range []struct {
		name, dest, mountpoint, rootfs string
		ok                             bool
	}{
		{"resolved in the rootfs", "/var/run/secrets/sa", "/run/secrets/sa", rootfs, true},
		{"as written", "/var/run/secrets/sa", "/run/secrets/sa", "", false},
		{"an absolute symlink resolves inside the rootfs", "/escape/shadow", "/etc/shadow", rootfs, true},
		{"a rootfs without the symlink", "/escape/shadow", "/etc/shadow", rootfs + "/nowhere", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &specs.Spec{Mounts: []specs.Mount{{Destination: tc.dest, Type: "bind", Source: "/host/sa", Options: []string{"rbind"}}}}
			m := Mount{ID: 11, Parent: 10, Mountpoint: tc.mountpoint, FSType: fsTmpfs, RootDev: 60, External: true, ExtKey: tc.mountpoint}
			err := checkMounts([]Mount{root, m}, spec, tc.rootfs)
			if (err == nil) != tc.ok {
				t.Fatalf("checkMounts: %v, want admitted %v", err, tc.ok)
			}
		})
	}
}
