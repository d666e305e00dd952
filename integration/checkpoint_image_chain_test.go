package integration

// TestCheckpointImageChain is issue 19's export that shares: checkpoints N and N+1 of a process
// whose memory is stored as what changed (pkg/pagechain) are exported as checkpoint images whose
// blobs, memory included, are one per checkpoint and the same bytes in both images, so pushing N+1
// after N uploads N+1's own blobs only, and a node that pulled N fetches only those too; both
// restore on a fresh containerd, N+1's memory read through N's extracted images; a memory chain
// with a blob left out or tampered with is refused, naming why.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cklite/cklite/pkg/ckimage"
)

func TestCheckpointImageChain(t *testing.T) {
	e := newCkEnv(t)
	const mib = 16
	c, _, p, start := e.memContainer(t, "chain", mib)
	rootfs := e.d.RootfsPath(c.ID())
	// Each exported right after its checkpoint, as a script would: the export waits for the
	// shim to store the checkpoint's memory as what changed since its parent's.
	repo := registry.Addr + "/cklite/chain"
	var cks []pagesCheckpoint
	var refs []string
	var mans []ocispec.Manifest
	for step := 1; step <= 2; step++ {
		writeMarkFiles(t, rootfs, fmt.Sprint("ck", step))
		ck := e.pagesCheckpoint(t, c.ID(), p, step, start.token, mib)
		ref := fmt.Sprintf("%s:ck%d", repo, step)
		began := time.Now()
		cklite(t, e.d, "checkpoint", "export", "--ref", ref, ck.id)
		logTiming(t, fmt.Sprintf("cklite checkpoint export of checkpoint %d", step), began)
		if r := waitReport(t, ck.dir); step == 2 && r.Parent != cks[0].id {
			t.Fatalf("checkpoint 2 is stored against %q (%s), want checkpoint 1 (%s)", r.Parent, r.Skipped, cks[0].id)
		}
		cks = append(cks, ck)
		refs = append(refs, ref)
		mans = append(mans, manifestOf(t, e, ref))
	}
	expectSharedMemory(t, mans[0], mans[1])
	// The same checkpoint is the same image, whenever exported.
	cklite(t, e.d, "checkpoint", "export", "--ref", repo+":ck1-again", cks[0].id)
	if a, b := imageDigest(t, e, refs[0]), imageDigest(t, e, repo+":ck1-again"); a != b {
		t.Fatalf("checkpoint 1 exported twice: manifests %s and %s, want the same", a, b)
	}

	// Pushed one after the other, N+1 uploads what N's image lacks, and nothing else.
	newer := blobsOf(mans[1])
	for d := range blobsOf(mans[0]) {
		delete(newer, d)
	}
	var pushed []*registryTraffic
	for i, ref := range refs {
		tr := newRegistryTraffic()
		img, err := e.d.Client().GetImage(e.ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		if err := e.d.Client().Push(e.ctx, ref, img.Target(), client.WithResolver(tr.resolver())); err != nil {
			t.Fatalf("push %s: %v", ref, err)
		}
		logTiming(t, fmt.Sprintf("push of checkpoint %d", i+1), began)
		t.Logf("push of checkpoint %d: %d blobs, %d bytes uploaded; the image is %d bytes", i+1, len(tr.uploaded()), tr.sentBytes(), imageBytes(mans[i]))
		pushed = append(pushed, tr)
	}
	expectTraffic(t, "push of checkpoint 2 after checkpoint 1", pushed[1].uploaded(), pushed[1].sentBytes(), newer)

	other := otherCkEnv(t)
	var pulled []client.Image
	for i, ref := range refs {
		tr := newRegistryTraffic()
		began := time.Now()
		img, err := other.d.Client().Pull(other.ctx, ref, client.WithResolver(tr.resolver()), client.WithPullUnpack, client.WithPullSnapshotter(ckliteSnapshotter))
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		logTiming(t, fmt.Sprintf("pull of checkpoint %d, fresh containerd", i+1), began)
		fetched := tr.fetchedBlobs()
		t.Logf("pull of checkpoint %d: %d blobs, %d bytes fetched", i+1, len(fetched), sum(fetched))
		if i == 1 {
			expectTraffic(t, "pull of checkpoint 2 after checkpoint 1", fetched, sum(fetched), newer)
		}
		pulled = append(pulled, img)
	}

	for i, img := range pulled {
		id := fmt.Sprint("chain-restored-", i+1)
		rc := other.newContainer(t, id, img)
		began := time.Now()
		if _, err := other.restore(rc, nil); err != nil {
			t.Fatalf("restoring checkpoint %d from its image: %v%s", i+1, err, criuErrors(err))
		}
		logTiming(t, fmt.Sprintf("create + start from the image of checkpoint %d", i+1), began)
		memProc{rootfs: other.d.RootfsPath(id)}.expect(t, fmt.Sprintf("restored from the image of checkpoint %d", i+1), cks[i].state)
		expectMarkFiles(t, other.d.RootfsPath(id), fmt.Sprint("ck", i+1))
	}
	chains := make([][]ocispec.Descriptor, len(pulled))
	for i, img := range pulled {
		ck, err := ckimage.Find(other.ctx, other.d.Client().ContentStore(), img.Name(), img.Target(), platforms.Default())
		if err != nil {
			t.Fatal(err)
		}
		chains[i] = ck.Chain()
	}
	expectCacheShared(t, other, chains[0], chains[1])

	t.Run("memory parent left out", func(t *testing.T) {
		m := mans[1]
		m.Layers = slices.DeleteFunc(slices.Clone(m.Layers), func(d ocispec.Descriptor) bool { return d.MediaType == ckimage.MediaTypeCheckpointParent })
		img := craftedImage(t, other, repo+":no-parent", m)
		_, err := other.restore(other.newContainer(t, "chain-no-parent", img), nil)
		expectErrorNaming(t, err, "pages in a parent image directory")
	})

	t.Run("memory parent swapped", func(t *testing.T) {
		// Checkpoint 2 read against a parent whose process is another one: its pages are not
		// where checkpoint 2's pagemaps say, or the process is not there at all.
		m := mans[1]
		m.Layers = slices.Clone(m.Layers)
		i := slices.IndexFunc(m.Layers, func(d ocispec.Descriptor) bool { return d.MediaType == ckimage.MediaTypeCheckpointParent })
		m.Layers[i] = foreignMemory(t, e, other)
		img := craftedImage(t, other, repo+":swapped-parent", m)
		_, err := other.restore(other.newContainer(t, "chain-swapped", img), nil)
		expectErrorNaming(t, err, "parent image directory")
	})

	// Last: it damages checkpoint 1's blob, checkpoint 2's memory parent, in the content store.
	t.Run("memory parent tampered", func(t *testing.T) {
		parent := chains[1][len(chains[1])-2]
		for _, chain := range chains {
			other.clearCache(t, chain...)
		}
		path := filepath.Join(other.d.Root, "io.containerd.content.v1.content", "blobs", "sha256", parent.Digest.Encoded())
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		data[len(data)/2] ^= 0xff
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err = other.restore(other.newContainer(t, "chain-tampered", pulled[1]), nil)
		expectErrorNaming(t, err, "does not match its digest", "are corrupt")
		expectErrorNaming(t, err, parent.Digest.String())
	})
}

// manifestOf is the manifest of image ref in e.
func manifestOf(t *testing.T, e *ckEnv, ref string) ocispec.Manifest {
	t.Helper()
	img, err := e.d.Client().GetImage(e.ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	m, err := images.Manifest(e.ctx, e.d.Client().ContentStore(), img.Target(), platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func imageDigest(t *testing.T, e *ckEnv, ref string) digest.Digest {
	t.Helper()
	img, err := e.d.Client().GetImage(e.ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	return img.Target().Digest
}

// expectSharedMemory checks that child's image holds every blob of parent's (its filesystem deltas
// and its memory chain, the checkpoint's own blob as a memory parent) and one memory blob more.
func expectSharedMemory(t *testing.T, parent, child ocispec.Manifest) {
	t.Helper()
	memory := func(m ocispec.Manifest) []ocispec.Descriptor {
		return slices.DeleteFunc(slices.Clone(m.Layers), func(d ocispec.Descriptor) bool { return !ckimage.IsMemory(d) })
	}
	pm, cm := memory(parent), memory(child)
	if len(cm) != len(pm)+1 {
		t.Fatalf("checkpoint 2's image has %d memory blobs, checkpoint 1's %d: want one more", len(cm), len(pm))
	}
	for i, d := range pm {
		if cm[i].Digest != d.Digest || cm[i].MediaType != ckimage.MediaTypeCheckpointParent {
			t.Fatalf("memory blob %d of checkpoint 2's image is %s (%s), checkpoint 1's is %s: want it shared, as a memory parent", i, cm[i].Digest, cm[i].MediaType, d.Digest)
		}
	}
	for _, d := range parent.Layers {
		if !slices.ContainsFunc(child.Layers, func(c ocispec.Descriptor) bool { return c.Digest == d.Digest }) {
			t.Fatalf("checkpoint 1's blob %s (%s) is not in checkpoint 2's image", d.Digest, d.MediaType)
		}
	}
	t.Logf("memory blobs: checkpoint 1 %d bytes, checkpoint 2's own %d bytes", pm[len(pm)-1].Size, cm[len(cm)-1].Size)
}

// blobsOf is the blobs of m (config and layers) and their sizes.
func blobsOf(m ocispec.Manifest) map[digest.Digest]int64 {
	b := map[digest.Digest]int64{m.Config.Digest: m.Config.Size}
	for _, l := range m.Layers {
		b[l.Digest] = l.Size
	}
	return b
}

func imageBytes(m ocispec.Manifest) int64 { return sum(blobsOf(m)) }

func sum(m map[digest.Digest]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// expectTraffic checks that the blobs moved are exactly want, and bytes their size.
func expectTraffic(t *testing.T, what string, moved map[digest.Digest]int64, bytes int64, want map[digest.Digest]int64) {
	t.Helper()
	if got := slices.Sorted(maps.Keys(moved)); !slices.Equal(got, slices.Sorted(maps.Keys(want))) {
		t.Fatalf("%s moved blobs %v, want only those the first image lacks: %v", what, got, slices.Sorted(maps.Keys(want)))
	}
	if bytes != sum(want) {
		t.Fatalf("%s moved %d bytes, want %d (the blobs the first image lacks)", what, bytes, sum(want))
	}
}

// expectMarkFiles is expectMarks for images other than busybox.
func expectMarkFiles(t *testing.T, rootfs, tag string) {
	t.Helper()
	got, err := readMarks(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	if want := wantMarks(tag); !maps.Equal(got, want) {
		t.Fatalf("restored checkpoint %s holds the marks %v, want %v", tag, got, want)
	}
}

// expectCacheShared checks that the shim extracted each image directory of the two chains once:
// the second chain's top reads from the first's.
func expectCacheShared(t *testing.T, e *ckEnv, first, second []ocispec.Descriptor) {
	t.Helper()
	inst, err := e.d.Instance(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	cache := inst.ImageCache()
	entries, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, en := range entries {
		if en.IsDir() && !strings.HasPrefix(en.Name(), ".") {
			dirs = append(dirs, en.Name())
		}
	}
	if len(dirs) != len(second) {
		t.Fatalf("the image cache holds %d image directories after restoring both images, want %d (each of the chain once): %v", len(dirs), len(second), dirs)
	}
	top := ckimage.CacheDir(cache, second)
	if parent, err := filepath.EvalSymlinks(filepath.Join(top, "parent")); err != nil || parent != ckimage.CacheDir(cache, first) {
		t.Fatalf("checkpoint 2's extracted images read from %q (%v), want checkpoint 1's %s", parent, err, ckimage.CacheDir(cache, first))
	}
}

// foreignMemory exports a checkpoint of another process in e and copies its CRIU blob into
// other's content store: a memory blob that is not the parent of any other.
func foreignMemory(t *testing.T, e, other *ckEnv) ocispec.Descriptor {
	t.Helper()
	c, _, p, start := e.memContainer(t, "chain-foreign", 8)
	ck := e.pagesCheckpoint(t, c.ID(), p, 1, start.token, 8)
	waitReport(t, ck.dir)
	ref := "localhost/cklite/chain-foreign:ck"
	cklite(t, e.d, "checkpoint", "export", "--ref", ref, ck.id)
	m := manifestOf(t, e, ref)
	blob := m.Layers[len(m.Layers)-1]
	data, err := content.ReadBlob(e.ctx, e.d.Client().ContentStore(), blob)
	if err != nil {
		t.Fatal(err)
	}
	if err := content.WriteBlob(other.ctx, other.d.Client().ContentStore(), "foreign-"+blob.Digest.Encoded(), bytes.NewReader(data), blob); err != nil {
		t.Fatal(err)
	}
	blob.MediaType = ckimage.MediaTypeCheckpointParent
	return blob
}

// craftedImage stores manifest m in e under name ref (its blobs must be there) and unpacks it.
func craftedImage(t *testing.T, e *ckEnv, ref string, m ocispec.Manifest) client.Image {
	t.Helper()
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(data), Size: int64(len(data))}
	labels := map[string]string{"containerd.io/gc.ref.content.config": m.Config.Digest.String()}
	for i, l := range m.Layers {
		labels[fmt.Sprintf("containerd.io/gc.ref.content.l.%d", i)] = l.Digest.String()
	}
	cs := e.d.Client().ContentStore()
	if err := content.WriteBlob(e.ctx, cs, "crafted-"+desc.Digest.Encoded(), bytes.NewReader(data), desc, content.WithLabels(labels)); err != nil {
		t.Fatal(err)
	}
	rec, err := e.d.Client().ImageService().Create(e.ctx, images.Image{Name: ref, Target: desc})
	if err != nil {
		t.Fatal(err)
	}
	img := client.NewImage(e.d.Client(), rec)
	unpack(t, e, img)
	return img
}

// registryTraffic counts the blobs a client uploads to and fetches from a registry, through the
// resolver it makes: what a registry push or pull really moves, the existing blobs a push skips
// (containerd's pusher asks with HEAD first) left out. Bodies are counted as they are closed (the
// transport may close a request's after RoundTrip returns): read the counts once the push or
// pull is done.
type registryTraffic struct {
	mu        sync.Mutex
	committed map[digest.Digest]bool  // blob uploads the registry accepted (201 to the PUT naming it)
	bodies    map[digest.Digest]int64 // bytes of blob upload bodies, by the digest their PUT names
	sent      int64                   // bytes of every blob upload body
	fetched   map[digest.Digest]int64 // blob GETs: bytes read
}

func newRegistryTraffic() *registryTraffic {
	return &registryTraffic{committed: map[digest.Digest]bool{}, bodies: map[digest.Digest]int64{}, fetched: map[digest.Digest]int64{}}
}

// resolver talks plain HTTP to any host, through rt.
func (rt *registryTraffic) resolver() remotes.Resolver {
	return docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(
		docker.WithPlainHTTP(docker.MatchAllHosts), docker.WithClient(&http.Client{Transport: rt}))})
}

// uploaded is the blobs uploaded and accepted, with the bytes sent for each.
func (rt *registryTraffic) uploaded() map[digest.Digest]int64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	up := map[digest.Digest]int64{}
	for d := range rt.committed {
		up[d] = rt.bodies[d]
	}
	return up
}

// sentBytes is the bytes of every blob upload body.
func (rt *registryTraffic) sentBytes() int64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.sent
}

// fetchedBlobs is the blobs fetched, with the bytes read of each.
func (rt *registryTraffic) fetchedBlobs() map[digest.Digest]int64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return maps.Clone(rt.fetched)
}

func (rt *registryTraffic) RoundTrip(req *http.Request) (*http.Response, error) {
	upload := strings.Contains(req.URL.Path, "/blobs/uploads/") && (req.Method == http.MethodPut || req.Method == http.MethodPatch)
	named := digest.Digest(req.URL.Query().Get("digest"))
	if upload && req.Body != nil {
		req.Body = &countingBody{ReadCloser: req.Body, done: func(n int64) {
			rt.mu.Lock()
			defer rt.mu.Unlock()
			rt.sent += n
			rt.bodies[named] += n
		}}
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if upload && req.Method == http.MethodPut && named != "" && resp.StatusCode == http.StatusCreated {
		rt.mu.Lock()
		rt.committed[named] = true
		rt.mu.Unlock()
	}
	if _, d, ok := strings.Cut(req.URL.Path, "/blobs/"); ok && !upload && req.Method == http.MethodGet && resp.StatusCode < 300 {
		resp.Body = &countingBody{ReadCloser: resp.Body, done: func(n int64) {
			rt.mu.Lock()
			defer rt.mu.Unlock()
			rt.fetched[digest.Digest(d)] += n
		}}
	}
	return resp, nil
}

// countingBody counts what is read through it, and tells done on Close.
type countingBody struct {
	io.ReadCloser
	n    int64
	done func(int64)
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	return n, err
}

func (b *countingBody) Close() error {
	if b.done != nil {
		b.done(b.n)
		b.done = nil
	}
	return b.ReadCloser.Close()
}
