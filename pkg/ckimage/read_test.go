package ckimage

import (
	"archive/tar"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/criuimage"
)

func TestPruneCache(t *testing.T) {
	cache := t.TempDir()
	old, fresh := filepath.Join(cache, "old"), filepath.Join(cache, "fresh")
	for _, d := range []string{old, fresh} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	if err := PruneCache(cache, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("an entry unused for 2h is still there (%v)", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh entry was pruned: %v", err)
	}
	if err := PruneCache(filepath.Join(cache, "none"), time.Hour); err != nil {
		t.Errorf("pruning a missing cache: %v", err)
	}
}

func TestCheckMounts(t *testing.T) {
	cri := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/proc", Type: "proc"},
		{Destination: "/etc/hosts", Type: "bind", Options: []string{"rbind", "ro"}},
		{Destination: "/dev/shm", Source: "/run/shm", Options: []string{"rbind"}},
		{Destination: "/etc/hosts/", Type: "bind"},
	}}
	if got, want := BindMounts(cri), []string{"/dev/shm", "/etc/hosts"}; !slices.Equal(got, want) {
		t.Fatalf("BindMounts: %q, want %q", got, want)
	}
	plain := &specs.Spec{Mounts: []specs.Mount{{Destination: "/proc", Type: "proc"}, {Destination: "/dev/shm", Type: "tmpfs"}}}
	for _, tc := range []struct {
		name        string
		label       string // "": none
		spec        *specs.Spec
		wantMissing string
	}{
		{name: "unrecorded", spec: plain},
		{name: "none dumped", label: `[]`, spec: cri},
		{name: "same", label: `["/dev/shm","/etc/hosts"]`, spec: cri},
		{name: "extra in the container", label: `["/etc/hosts"]`, spec: cri},
		{name: "missing", label: `["/dev/shm","/etc/hosts"]`, spec: plain, wantMissing: "/dev/shm, /etc/hosts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Checkpoint{Config: ocispec.ImageConfig{Labels: map[string]string{LabelCheckpoint: "abc"}}}
			if tc.label != "" {
				c.Config.Labels[LabelBindMounts] = tc.label
			}
			err := c.CheckMounts(tc.spec)
			switch {
			case tc.wantMissing == "" && err != nil:
				t.Fatalf("CheckMounts: %v", err)
			case tc.wantMissing != "" && (err == nil || !strings.Contains(err.Error(), "bind mounts at "+tc.wantMissing+",") || !errdefs.IsFailedPrecondition(err)):
				t.Fatalf("CheckMounts: %v, want FailedPrecondition naming %s", err, tc.wantMissing)
			}
		})
	}
}

// TestMemoryParents: a checkpoint image's memory chain is one run of parent blobs right before the
// checkpoint's, at most criuimage.MaxChain of them; anything else is refused.
func TestMemoryParents(t *testing.T) {
	layer := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerZstd, Digest: "sha256:l"}
	parent := func(n string) ocispec.Descriptor {
		return ocispec.Descriptor{MediaType: MediaTypeCheckpointParent, Digest: digest.Digest("sha256:p" + n)}
	}
	top := ocispec.Descriptor{MediaType: MediaTypeCheckpoint, Digest: "sha256:c"}
	long := []ocispec.Descriptor{layer}
	for i := range criuimage.MaxChain + 1 {
		long = append(long, parent(strconv.Itoa(i)))
	}
	for _, tc := range []struct {
		name   string
		layers []ocispec.Descriptor
		want   int    // parents found
		refuse string // "": accepted
	}{
		{name: "flattened", layers: []ocispec.Descriptor{layer, top}},
		{name: "chain", layers: []ocispec.Descriptor{layer, layer, parent("1"), parent("2"), top}, want: 2},
		{name: "parent after", layers: []ocispec.Descriptor{layer, parent("1"), top, parent("2")}, refuse: "after the checkpoint's CRIU images"},
		{name: "two checkpoints", layers: []ocispec.Descriptor{layer, top, top}, refuse: "after the checkpoint's CRIU images"},
		{name: "not one run", layers: []ocispec.Descriptor{parent("1"), layer, parent("2"), top}, refuse: "not one run"},
		{name: "too long", layers: append(long, top), refuse: "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := slices.IndexFunc(tc.layers, func(d ocispec.Descriptor) bool { return d.MediaType == MediaTypeCheckpoint })
			parents, err := memoryParents(tc.layers, i)
			switch {
			case tc.refuse == "" && (err != nil || len(parents) != tc.want):
				t.Fatalf("memoryParents: %d, %v; want %d", len(parents), err, tc.want)
			case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse) || !errdefs.IsInvalidArgument(err)):
				t.Fatalf("memoryParents: %v, want InvalidArgument saying %q", err, tc.refuse)
			}
		})
	}
}

// TestUntarBudget: an extraction leaves 1/20 of its filesystem's bytes and inodes free, entry by
// entry; a filesystem that counts no inodes bounds the bytes only.
func TestUntarBudget(t *testing.T) {
	ext4 := unix.Statfs_t{Bsize: 4096, Blocks: 1000, Bavail: 100, Files: 100, Ffree: 8} // 204800 bytes and 3 inodes to take
	btrfs := unix.Statfs_t{Bsize: 4096, Blocks: 1000, Bavail: 100}
	for _, tc := range []struct {
		name    string
		st      unix.Statfs_t
		sizes   []int64 // the entries, in order
		refused int     // index of the first refused, -1: none
	}{
		{name: "fits", st: ext4, sizes: []int64{0, 204800}, refused: -1},
		{name: "bytes", st: ext4, sizes: []int64{204800, 1}, refused: 1},
		{name: "inodes", st: ext4, sizes: []int64{0, 0, 0, 0}, refused: 3},
		{name: "no inode count", st: btrfs, sizes: make([]int64, 1000), refused: -1},
		{name: "no inode count, bytes", st: btrfs, sizes: []int64{204801}, refused: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := budgetOf(tc.st)
			refused := -1
			for i, size := range tc.sizes {
				if err := b.take(&tar.Header{Name: "f" + strconv.Itoa(i), Size: size}, "/d"); err != nil {
					refused = i
					break
				}
			}
			if refused != tc.refused {
				t.Fatalf("entry %d refused, want %d", refused, tc.refused)
			}
		})
	}
}
