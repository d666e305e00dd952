package export

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
	imagespec "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/ckimage"
	"github.com/cklite/cklite/pkg/criuimage"
	"github.com/cklite/cklite/pkg/pagechain"
)

// criuDir writes a minimal CRIU image directory of checkpoint id.
func criuDir(t *testing.T, id string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "inventory.img"), []byte("inventory"), 0o600); err != nil {
		t.Fatal(err)
	}
	meta := checkpoint.Meta{ID: id, Contents: checkpoint.MemoryAndFS, Snapshotter: "cklite", Frozen: checkpoint.FrozenName(id), Created: time.Now()}
	if err := checkpoint.Write(dir, meta); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newStore is a local content store in root that keeps labels, as containerd's does.
func newStore(t *testing.T, root string) content.Store {
	t.Helper()
	cs, err := local.NewLabeledStore(root, labelStore{})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

type labelStore map[digest.Digest]map[string]string

func (s labelStore) Get(d digest.Digest) (map[string]string, error) { return s[d], nil }

func (s labelStore) Set(d digest.Digest, l map[string]string) error {
	s[d] = l
	return nil
}

func (s labelStore) Update(d digest.Digest, l map[string]string) (map[string]string, error) {
	if s[d] == nil {
		s[d] = map[string]string{}
	}
	for k, v := range l {
		s[d][k] = v
	}
	return s[d], nil
}

// baseImage stores a one-layer image with an entrypoint and cmd in cs.
func baseImage(t *testing.T, ctx context.Context, cs content.Store) images.Image {
	t.Helper()
	layer := []byte("not really a tar")
	layerDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.FromBytes(layer), Size: int64(len(layer))}
	if err := content.WriteBlob(ctx, cs, "layer", bytes.NewReader(layer), layerDesc); err != nil {
		t.Fatal(err)
	}
	cfg := ocispec.Image{
		Platform: platforms.DefaultSpec(),
		Config:   ocispec.ImageConfig{Entrypoint: []string{"/bin/sh"}, Cmd: []string{"-c", "true"}, Labels: map[string]string{"kept": "yes"}},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{layerDesc.Digest}},
	}
	cfgDesc, err := writeJSON(ctx, cs, ocispec.MediaTypeImageConfig, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := ocispec.Manifest{Versioned: imagespec.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: cfgDesc, Layers: []ocispec.Descriptor{layerDesc}}
	mDesc, err := writeJSON(ctx, cs, ocispec.MediaTypeImageManifest, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	return images.Image{Name: "base:latest", Target: mDesc}
}

func TestWriteFindExtract(t *testing.T) {
	ctx := context.Background()
	cs := newStore(t, t.TempDir())
	base := baseImage(t, ctx, cs)
	delta := []byte("delta layer")
	deltaDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromBytes(delta), Size: int64(len(delta))}
	if err := content.WriteBlob(ctx, cs, "delta", bytes.NewReader(delta), deltaDesc); err != nil {
		t.Fatal(err)
	}
	diffID := digest.FromString("uncompressed delta")
	src := criuDir(t, "abc")
	spec := Spec{Base: base, Deltas: []Layer{{Desc: deltaDesc, DiffID: diffID}}, CRIUDir: src, Meta: checkpoint.Meta{ID: "abc"}}
	target, err := Write(ctx, cs, spec)
	if err != nil {
		t.Fatal(err)
	}

	m, err := images.Manifest(ctx, cs, target, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 3 || m.Layers[1].Digest != deltaDesc.Digest || m.Layers[2].MediaType != ckimage.MediaTypeCheckpoint {
		t.Fatalf("manifest layers %+v: want base, delta, CRIU images", m.Layers)
	}
	info, err := cs.Info(ctx, target.Digest)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range m.Layers {
		if k := "containerd.io/gc.ref.content.l." + strconv.Itoa(i); info.Labels[k] != l.Digest.String() {
			t.Errorf("manifest label %s = %q, want %s: the collector would free the blob", k, info.Labels[k], l.Digest)
		}
	}
	var cfg ocispec.Image
	data, err := content.ReadBlob(ctx, cs, m.Config)
	if err == nil {
		err = json.Unmarshal(data, &cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	if !ckimage.IsMarker(c.Entrypoint) || len(c.Cmd) != 0 || c.Labels[ckimage.LabelEntrypoint] != `["/bin/sh"]` || c.Labels[ckimage.LabelCmd] != `["-c","true"]` ||
		c.Labels[ckimage.LabelCheckpoint] != "abc" || c.Labels[ckimage.LabelBase] != "base:latest" || c.Labels["kept"] != "yes" {
		t.Errorf("config %+v: want the marker entrypoint, no cmd, the originals and the checkpoint in labels", c)
	}
	if len(cfg.RootFS.DiffIDs) != 2 || cfg.RootFS.DiffIDs[1] != diffID || len(cfg.History) != 1 {
		t.Errorf("rootfs %+v, history %d: want the base's diff id and the delta's, one history entry", cfg.RootFS, len(cfg.History))
	}

	ck, err := ckimage.Find(ctx, cs, "ck", target, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	blob := ck.Blob
	if len(ck.Parents) != 0 {
		t.Fatalf("a checkpoint without a memory parent exported with parents %v", ck.Parents)
	}

	// A checkpoint of a container restored from the image stacks on its layers, not its CRIU
	// images, and keeps the original entrypoint.
	next := Spec{Base: images.Image{Name: "ck", Target: target}, Deltas: spec.Deltas, CRIUDir: criuDir(t, "def"), Meta: checkpoint.Meta{ID: "def"}}
	nextTarget, err := Write(ctx, cs, next)
	if err != nil {
		t.Fatal(err)
	}
	nm, err := images.Manifest(ctx, cs, nextTarget, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	var ncfg ocispec.Image
	if data, err := content.ReadBlob(ctx, cs, nm.Config); err != nil || json.Unmarshal(data, &ncfg) != nil {
		t.Fatalf("config of the second image: %v", err)
	}
	if len(nm.Layers) != 4 || nm.Layers[2].MediaType == ckimage.MediaTypeCheckpoint || len(ncfg.RootFS.DiffIDs) != 3 ||
		ncfg.Config.Labels[ckimage.LabelEntrypoint] != `["/bin/sh"]` || ncfg.Config.Labels[ckimage.LabelCheckpoint] != "def" {
		t.Fatalf("image on a checkpoint image: layers %+v, config %+v", nm.Layers, ncfg)
	}
	// The same checkpoint is the same image: a registry that has it stores nothing again.
	if again, err := Write(ctx, cs, spec); err != nil || again.Digest != target.Digest {
		t.Fatalf("writing the image again: %v, manifest %s, first %s: want the same", err, again.Digest, target.Digest)
	}
	cache := t.TempDir()
	var wg sync.WaitGroup
	dirs := make([]string, 8)
	errs := make([]error, 8)
	for i := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dirs[i], errs[i] = ckimage.Extract(ctx, cs, ck.Chain(), cache)
		}()
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != filepath.Join(cache, blob.Digest.Encoded()) {
			t.Fatalf("concurrent extract %d: %q, %v", i, dirs[i], errs[i])
		}
	}
	if m, err := checkpoint.Read(dirs[0]); err != nil || m.ID != "abc" {
		t.Fatalf("extracted metadata %+v, %v", m, err)
	}
	if entries, _ := os.ReadDir(cache); len(entries) != 1 {
		t.Fatalf("the cache holds %d entries after concurrent extracts, want 1", len(entries))
	}
	// The cache serves every namespace of the containerd: its copy is used only by a store that
	// holds the blob (a digest is no secret, the memory behind it is).
	if _, err := ckimage.Extract(ctx, newStore(t, t.TempDir()), ck.Chain(), cache); !errdefs.IsNotFound(err) {
		t.Fatalf("Extract from a store without the blob, already extracted: %v, want NotFound", err)
	}

	if _, err := ckimage.Find(ctx, cs, "base", base.Target, platforms.Default()); !errdefs.IsNotFound(err) {
		t.Errorf("Find in a plain image: %v, want NotFound", err)
	}
}

func TestExtractBad(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		files map[string]string // tar entries; "" name: none
		// damage changes the blob's descriptor or, stored in root, the blob.
		damage func(d *ocispec.Descriptor, root string) error
		// onParent extracts the blob as the top of a chain, on a valid parent blob.
		onParent bool
		// sizes are the sizes headers claim, where not their data's: the tar ends there.
		sizes map[string]int64
		// zstdWindow, if set, is the window the blob's zstd stream asks its decoder to keep.
		zstdWindow int
		want       string
	}{
		{name: "not cklite", files: map[string]string{"inventory.img": "x"}, want: "not a cklite checkpoint"},
		{name: "missing", files: map[string]string{"inventory.img": "x"}, damage: func(d *ocispec.Descriptor, _ string) error {
			d.Digest = digest.FromString("other")
			return nil
		}, want: "not in the content store"},
		{name: "corrupt", files: map[string]string{"inventory.img": "x"}, damage: func(d *ocispec.Descriptor, root string) error {
			path := filepath.Join(root, "blobs", "sha256", d.Digest.Encoded())
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			data[512] ^= 1 // the file's contents, after its header: only the digest can tell
			return os.WriteFile(path, data, 0o644)
		}, want: "does not match its digest"},
		{name: "truncated", files: map[string]string{"inventory.img": "x"}, damage: func(d *ocispec.Descriptor, root string) error {
			return os.Truncate(filepath.Join(root, "blobs", "sha256", d.Digest.Encoded()), d.Size/3)
		}, want: "are corrupt"},
		// A manifest's digest names the cache directory: one that is no digest could name
		// another checkpoint's image directory (here the store's root, made one), which an
		// extraction already there would hand the restore without reading the blob.
		{name: "digest leaves the cache", files: map[string]string{"inventory.img": "x"}, damage: func(d *ocispec.Descriptor, root string) error {
			d.Digest = digest.Digest("sha256:" + strings.Repeat("../", 64) + root)
			return os.WriteFile(filepath.Join(root, checkpoint.MetaFile), []byte(`{"format":1,"id":"victim","contents":"memory"}`), 0o600)
		}, want: "invalid checksum digest"},
		// Its header alone: the size is refused before anything is read or written.
		{name: "fills the disk", files: map[string]string{"pages-1.img": ""}, sizes: map[string]int64{"pages-1.img": 1 << 62}, want: "of the disk"},
		// A valid checkpoint, in a stream whose decoder would keep 512 MiB.
		{name: "zstd window", zstdWindow: zstd.MaxWindowSize, want: "window size exceeded", files: map[string]string{
			"inventory.img": "x", checkpoint.MetaFile: `{"format":1,"id":"x","contents":"memory"}`}},
		{name: "escape", files: map[string]string{"../evil": "x"}, want: "leaves the directory"},
		{name: "absolute", files: map[string]string{"/evil": "x"}, want: "leaves the directory"},
		{name: "no inventory", files: map[string]string{checkpoint.MetaFile: `{"format":1,"id":"x","contents":"memory"}`}, want: "not a CRIU image directory"},
		{name: "own parent link", onParent: true, want: "which names the parent image directory", files: map[string]string{
			"inventory.img": "x", checkpoint.MetaFile: `{"format":1,"id":"x","contents":"memory"}`, criuimage.ParentLink: "../elsewhere"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			cs := newStore(t, root)
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for name, data := range tc.files {
				size, claimed := tc.sizes[name]
				if !claimed {
					size = int64(len(data))
				}
				if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: size, Typeflag: tar.TypeReg}); err != nil {
					t.Fatal(err)
				}
				if _, err := tw.Write([]byte(data)); err != nil {
					t.Fatal(err)
				}
			}
			if len(tc.sizes) == 0 {
				if err := tw.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if tc.zstdWindow != 0 {
				// Zeros after the tar's end, as its own padding: a stream shorter than its
				// window gets a smaller one from the encoder.
				buf = zstdStream(t, append(buf.Bytes(), make([]byte, 4<<20)...), tc.zstdWindow)
			}
			desc := ocispec.Descriptor{MediaType: ckimage.MediaTypeCheckpoint, Digest: digest.FromBytes(buf.Bytes()), Size: int64(buf.Len())}
			if err := content.WriteBlob(ctx, cs, "blob", bytes.NewReader(buf.Bytes()), desc); err != nil {
				t.Fatal(err)
			}
			if tc.damage != nil {
				if err := tc.damage(&desc, root); err != nil {
					t.Fatal(err)
				}
			}
			chain := []ocispec.Descriptor{desc}
			if tc.onParent {
				parent, err := writeMemory(ctx, cs, criuDir(t, "p"))
				if err != nil {
					t.Fatal(err)
				}
				chain = append(parent, desc)
			}
			cache := t.TempDir()
			_, err := ckimage.Extract(ctx, cs, chain, cache)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Extract: %v, want an error saying %q", err, tc.want)
			}
			// The valid parent stays extracted; nothing else.
			if entries, _ := os.ReadDir(cache); len(entries) != len(chain)-1 {
				t.Errorf("a failed extract left %d entries in the cache, want %d", len(entries), len(chain)-1)
			}
		})
	}
}

// zstdStream compresses data as a stream (no single segment) whose header asks for window.
func zstdStream(t *testing.T, data []byte, window int) bytes.Buffer {
	t.Helper()
	var out bytes.Buffer
	zw, err := zstd.NewWriter(&out, zstd.WithWindowSize(window), zstd.WithSingleSegment(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestWriteChain exports a checkpoint whose memory is stored as what changed since its parent's:
// one blob per image directory of the chain, the same bytes on every export and in the image of
// the parent alone, so that a registry holding the parent's image gets only the child's blob; and
// the chain extracted again reads the child's pages (Detach copies them in from the parent).
func TestWriteChain(t *testing.T) {
	ctx := context.Background()
	cs := newStore(t, t.TempDir())
	parent, child := dedupedPair(t)
	if err := pagechain.WriteReport(child, pagechain.Report{Parent: "p", TookMs: 12}); err != nil {
		t.Fatal(err)
	}
	blobs, err := writeMemory(ctx, cs, child)
	if err != nil {
		t.Fatal(err)
	}
	if len(blobs) != 2 || blobs[0].MediaType != ckimage.MediaTypeCheckpointParent || blobs[1].MediaType != ckimage.MediaTypeCheckpoint {
		t.Fatalf("blobs %+v: want the parent's, then the checkpoint's", blobs)
	}
	// Timing in the report, a killed rewrite's leftovers: none of it is the checkpoint's.
	if err := pagechain.WriteReport(child, pagechain.Report{Parent: "p", TookMs: 99}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{".pages-9.img.tmp", "pages-7.img"} {
		if err := os.WriteFile(filepath.Join(child, n), []byte("left over"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	again, err := writeMemory(ctx, cs, child)
	if err != nil {
		t.Fatal(err)
	}
	alone, err := writeMemory(ctx, cs, parent)
	if err != nil {
		t.Fatal(err)
	}
	if again[0].Digest != blobs[0].Digest || again[1].Digest != blobs[1].Digest || alone[0].Digest != blobs[0].Digest {
		t.Fatalf("exported again %v, the parent alone %v, first %v: want the same digests", again, alone, blobs)
	}
	// Pages stored compressed are exported as CRIU wrote them: the same blobs.
	if c, err := pagechain.Compress(parent); err != nil || c.Files != 1 {
		t.Fatalf("compress the parent's pages: %+v, %v", c, err)
	}
	if compressed, err := writeMemory(ctx, cs, child); err != nil || compressed[0].Digest != blobs[0].Digest || compressed[1].Digest != blobs[1].Digest {
		t.Fatalf("exported with the parent's pages compressed: %v, %v; want the digests of %v", compressed, err, blobs)
	}
	cache := t.TempDir()
	dir, err := ckimage.Extract(ctx, cs, blobs, cache)
	if err != nil {
		t.Fatal(err)
	}
	if dir != ckimage.CacheDir(cache, blobs) {
		t.Fatalf("extracted into %s, want %s", dir, ckimage.CacheDir(cache, blobs))
	}
	chain, err := criuimage.Chain(dir, cache)
	if err != nil || len(chain) != 1 || chain[0] != ckimage.CacheDir(cache, blobs[:1]) {
		t.Fatalf("the extracted chain: %v, %v; want the parent's blob below", chain, err)
	}
	for _, n := range []string{pagechain.ReportFile, ".pages-9.img.tmp", "pages-7.img"} {
		if _, err := os.Stat(filepath.Join(dir, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was exported: %v", n, err)
		}
	}
	pm, err := criuimage.ReadPagemap(filepath.Join(dir, "pagemap-1.img"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, pm.PagesName())); err != nil || fi.Size() != int64(os.Getpagesize()) {
		t.Fatalf("the child's pages file: %v, %v; want the one page that changed", fi, err)
	}
	if _, err := pagechain.Detach(dir); err != nil {
		t.Fatal(err)
	}
	if got := pages(t, dir); got != "abXd" {
		t.Fatalf("pages of the extracted chain %q, want abXd", got)
	}
}

// dedupedPair writes two image directories of one process, the child's pages stored as what
// changed since the parent's: abcd, then abXd.
func dedupedPair(t *testing.T) (parent, child string) {
	t.Helper()
	root := t.TempDir()
	page := os.Getpagesize()
	dump := func(name, id, pages string) string {
		dir := filepath.Join(root, name)
		if err := os.Rename(criuDir(t, id), dir); err != nil {
			t.Fatal(err)
		}
		pm := criuimage.PagemapFile{PagesID: 1, Runs: []criuimage.PageRun{{Vaddr: 0x400000, Pages: uint64(len(pages)), Flags: criuimage.PagePresent}}}
		var data []byte
		for _, c := range pages {
			data = append(data, bytes.Repeat([]byte{byte(c)}, page)...)
		}
		for n, b := range map[string][]byte{"pagemap-1.img": pm.Encode(), "pages-1.img": data} {
			if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	parent = dump("parent", "p", "abcd")
	child = dump("child", "c", "abXd")
	if res, err := pagechain.Dedup(child, parent); err != nil || res.InParent != 3 {
		t.Fatalf("dedup: %+v, %v", res, err)
	}
	return parent, child
}

// pages is the first byte of each page of process 1 in dir, which must need no parent.
func pages(t *testing.T, dir string) string {
	t.Helper()
	pm, err := criuimage.ReadPagemap(filepath.Join(dir, "pagemap-1.img"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, pm.PagesName()))
	if err != nil {
		t.Fatal(err)
	}
	if pm.PresentPages()*uint64(os.Getpagesize()) != uint64(len(data)) {
		t.Fatalf("%s: %d present pages, %d bytes of pages", dir, pm.PresentPages(), len(data))
	}
	var got []byte
	for i := 0; i < len(data); i += os.Getpagesize() {
		got = append(got, data[i])
	}
	return string(got)
}
