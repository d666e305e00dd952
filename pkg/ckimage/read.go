package ckimage

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/criuimage"
)

// Checkpoint is what a restore needs from a checkpoint image.
type Checkpoint struct {
	Blob ocispec.Descriptor // the CRIU images of the checkpoint
	// Parents are the CRIU images of its memory chain, bottom first: Blob reads pages from the
	// last, which reads from the one before, and so on.
	Parents []ocispec.Descriptor
	Config  ocispec.ImageConfig
}

// Chain is the checkpoint's CRIU image blobs, bottom first, Blob last: what Extract takes.
func (c Checkpoint) Chain() []ocispec.Descriptor {
	return append(slices.Clone(c.Parents), c.Blob)
}

// Find returns the checkpoint of the checkpoint image whose manifest (or index) is target. An
// image without CRIU images is errdefs.ErrNotFound.
func Find(ctx context.Context, cs content.Provider, name string, target ocispec.Descriptor, platform platforms.MatchComparer) (Checkpoint, error) {
	m, err := images.Manifest(ctx, cs, target, platform)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("manifest of image %s: %w", name, err)
	}
	i := slices.IndexFunc(m.Layers, func(l ocispec.Descriptor) bool { return l.MediaType == MediaTypeCheckpoint })
	if i < 0 {
		return Checkpoint{}, fmt.Errorf("image %s is not a cklite checkpoint image: its manifest has no %s entry: %w", name, MediaTypeCheckpoint, errdefs.ErrNotFound)
	}
	parents, err := memoryParents(m.Layers, i)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("image %s: %w", name, err)
	}
	data, err := readConfig(ctx, cs, m.Config)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("config of image %s: %w", name, err)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(data, &cfg); err != nil {
		return Checkpoint{}, fmt.Errorf("config of image %s: %w", name, err)
	}
	return Checkpoint{Blob: m.Layers[i], Parents: parents, Config: cfg.Config}, nil
}

// memoryParents returns the MediaTypeCheckpointParent entries of layers, which must all come
// right before the checkpoint's own entry, layers[top], and be at most criuimage.MaxChain.
func memoryParents(layers []ocispec.Descriptor, top int) ([]ocispec.Descriptor, error) {
	var parents []ocispec.Descriptor
	for i, l := range layers {
		if !IsMemory(l) || i == top {
			continue
		}
		if l.MediaType != MediaTypeCheckpointParent || i > top {
			return nil, fmt.Errorf("manifest entry %d (%s) is a %s after the checkpoint's CRIU images: a checkpoint image has one checkpoint, its memory chain before it: %w",
				i, l.Digest, l.MediaType, errdefs.ErrInvalidArgument)
		}
		parents = append(parents, l)
	}
	if len(parents) > 0 && top-len(parents) != slices.IndexFunc(layers, IsMemory) {
		return nil, fmt.Errorf("the memory chain of the checkpoint's CRIU images is not one run of manifest entries before them: %w", errdefs.ErrInvalidArgument)
	}
	if len(parents) > criuimage.MaxChain {
		return nil, fmt.Errorf("the checkpoint's memory chain has %d parent image directories, more than %d: %w", len(parents), criuimage.MaxChain, errdefs.ErrInvalidArgument)
	}
	return parents, nil
}

// CheckMounts refuses a restore whose container lacks a bind mount the checkpoint was dumped
// with: CRIU restores exactly the mounts it dumped, and fails on a missing one with a message
// naming only a mount id. An image that does not record its mounts passes.
func (c Checkpoint) CheckMounts(spec *specs.Spec) error {
	label, ok := c.Config.Labels[LabelBindMounts]
	if !ok {
		return nil
	}
	var dumped []string
	if err := json.Unmarshal([]byte(label), &dumped); err != nil {
		return fmt.Errorf("label %s of the checkpoint image: %w", LabelBindMounts, err)
	}
	have := BindMounts(spec)
	var missing []string
	for _, d := range dumped {
		if !slices.Contains(have, d) {
			missing = append(missing, d)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("checkpoint %s was dumped with bind mounts at %s, which this container lacks: CRIU restores exactly the mounts it dumped, so create the container as the checkpointed one was (a CRI checkpoint in a CRI pod): %w",
			c.Config.Labels[LabelCheckpoint], strings.Join(missing, ", "), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// CacheDir is the directory of cache that Extract unpacks the top of chain (CRIU image blobs,
// bottom first) into: named by the chain's OCI chain id, so that an image directory is one blob
// on one chain of parents (a lone blob's is its digest), and the parents shared by the images of
// several checkpoints are unpacked once.
func CacheDir(cache string, chain []ocispec.Descriptor) string {
	digests := make([]digest.Digest, len(chain))
	for i, d := range chain {
		digests[i] = d.Digest
	}
	return filepath.Join(cache, identity.ChainID(digests).Encoded())
}

// Extract unpacks the CRIU image blobs of chain (a checkpoint's, Checkpoint.Chain: its memory
// chain bottom first, the checkpoint last) into cache, each into CacheDir of the chain up to it
// unless it is there already, each but the first with a parent link to the one below, and
// returns the last's directory. Each blob must be in cs, also when its copy is in the cache
// already (the cache serves every namespace). Every directory of the chain gets its modification time set to
// now (its last use, for PruneCache; a parent is never older than its children). Each blob is
// verified against its digest and must hold a cklite checkpoint whose memory images are complete
// (the pages read from a parent are checked by the restore's admission, pkg/criuimage, against
// the parent). Containers created at once from one image, by shims of their own, share one copy:
// the first extracts it while the others wait on the cache's lock.
func Extract(ctx context.Context, cs content.InfoReaderProvider, chain []ocispec.Descriptor, cache string) (string, error) {
	if len(chain) == 0 || len(chain) > criuimage.MaxChain+1 {
		return "", fmt.Errorf("a checkpoint image's memory is 1 to %d CRIU image blobs, not %d: %w", criuimage.MaxChain+1, len(chain), errdefs.ErrInvalidArgument)
	}
	// The digests name directories of the cache (CacheDir): one that is not a digest, from a
	// crafted manifest, could name a directory outside it, which would be taken for an
	// extraction already made.
	for _, d := range chain {
		if err := d.Digest.Validate(); err != nil {
			return "", fmt.Errorf("CRIU images %q of the checkpoint image: %v: %w", d.Digest, err, errdefs.ErrInvalidArgument)
		}
	}
	unlock, err := lockCache(cache)
	if err != nil {
		return "", err
	}
	defer unlock()
	now := time.Now()
	parent := ""
	for i := range chain {
		dir := CacheDir(cache, chain[:i+1])
		if err := extractLevel(ctx, cs, chain[i], dir, parent, now); err != nil {
			return "", err
		}
		parent = dir
	}
	return parent, nil
}

// extractLevel makes dir the image directory of blob desc with a parent link to parent (none
// when ""), unless it is there already, and sets its modification time to now.
func extractLevel(ctx context.Context, cs content.InfoReaderProvider, desc ocispec.Descriptor, dir, parent string, now time.Time) error {
	// Asked before the cache is: the cache is shared by every namespace of the containerd, and
	// only a store that holds the blob may use its copy (a digest is no secret, the memory is).
	if err := present(ctx, cs, desc); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, checkpoint.MetaFile)); err == nil {
		if err := os.Chtimes(dir, now, now); err != nil {
			return fmt.Errorf("checkpoint image cache: %w", err)
		}
		return nil
	}
	cache := filepath.Dir(dir)
	tmp, err := os.MkdirTemp(cache, ".extract-")
	if err != nil {
		return fmt.Errorf("checkpoint image cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := extractBlob(ctx, cs, desc, tmp); err != nil {
		return err
	}
	if _, err := checkpoint.Read(tmp); err != nil {
		return fmt.Errorf("CRIU images %s of the checkpoint image: %w", desc.Digest, err)
	}
	if err := checkpoint.CheckImages(tmp); err != nil {
		return fmt.Errorf("CRIU images %s of the checkpoint image: %w", desc.Digest, err)
	}
	if parent != "" {
		// Relative, within the cache: the link reads the same from tmp and from dir. Untar
		// made no entry of that name (it writes files and directories only, and refuses a
		// blob that holds one as a file here).
		if err := os.Symlink(filepath.Join("..", filepath.Base(parent)), filepath.Join(tmp, criuimage.ParentLink)); err != nil {
			return fmt.Errorf("the CRIU images of the checkpoint image (blob %s) hold an entry %q, which names the parent image directory: %v: %w",
				desc.Digest, criuimage.ParentLink, err, errdefs.ErrInvalidArgument)
		}
	}
	// Whatever stands at dir without cklite.json is a copy an extraction never finished.
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("checkpoint image cache: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("checkpoint image cache: %w", err)
	}
	return nil
}

// lockCache takes the cache's lock, the file cache.lock next to it, shared by every shim on the
// host; unlock releases it.
func lockCache(cache string) (unlock func(), err error) {
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint image cache: %w", err)
	}
	f, err := os.OpenFile(cache+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("checkpoint image cache: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the checkpoint image cache: %w", err)
	}
	return func() { f.Close() }, nil
}

// PruneCache removes the extracted copies in cache last used more than maxAge ago, and what
// extractions that died left behind. Under the cache's lock it only renames them out of the way,
// so no Extract finds a copy half removed; the removal itself runs after.
func PruneCache(cache string, maxAge time.Duration) error {
	if _, err := os.Stat(cache); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	unlock, err := lockCache(cache)
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(cache)
	var errs []error
	var trash []string
	for _, e := range entries {
		info, ierr := e.Info()
		if ierr != nil || time.Since(info.ModTime()) < maxAge {
			continue
		}
		t := filepath.Join(cache, ".trash-"+strings.TrimPrefix(e.Name(), ".trash-"))
		if err := os.Rename(filepath.Join(cache, e.Name()), t); err != nil {
			errs = append(errs, err)
			continue
		}
		trash = append(trash, t)
	}
	unlock()
	if err != nil {
		return err
	}
	for _, t := range trash {
		if err := os.RemoveAll(t); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// present checks that cs holds desc's blob, of its size. A proxy content store opens anything and
// fails only on the first read: ask first.
func present(ctx context.Context, cs content.InfoProvider, desc ocispec.Descriptor) error {
	info, err := cs.Info(ctx, desc.Digest)
	if errdefs.IsNotFound(err) {
		return missing(desc, err)
	}
	if err != nil {
		return fmt.Errorf("CRIU images %s of the checkpoint image: %w", desc.Digest, err)
	}
	if info.Size != desc.Size {
		return fmt.Errorf("the CRIU images of the checkpoint image (blob %s) are corrupt: %d bytes in the content store, the manifest says %d: %w", desc.Digest, info.Size, desc.Size, errdefs.ErrDataLoss)
	}
	return nil
}

// extractBlob unpacks desc's blob, which present found in cs, into dir.
func extractBlob(ctx context.Context, cs content.InfoReaderProvider, desc ocispec.Descriptor, dir string) error {
	ra, err := cs.ReaderAt(ctx, desc)
	if err != nil {
		return fmt.Errorf("CRIU images %s of the checkpoint image: %w", desc.Digest, err)
	}
	defer ra.Close()
	verifier := desc.Digest.Verifier()
	// Large reads: through containerd's content proxy each read is a request.
	raw := io.TeeReader(bufio.NewReaderSize(content.NewReader(ra), 4<<20), verifier)
	r, err := decompress(raw)
	if errdefs.IsNotFound(err) { // known to containerd's metadata, gone from the disk
		return missing(desc, err)
	}
	if err != nil {
		return fmt.Errorf("the CRIU images of the checkpoint image (blob %s) are corrupt: %v: %w", desc.Digest, err, errdefs.ErrDataLoss)
	}
	defer r.Close()
	if err := Untar(r, dir); err != nil {
		if errdefs.IsNotFound(err) { // known to containerd's metadata, gone from the disk
			return missing(desc, err)
		}
		return fmt.Errorf("the CRIU images of the checkpoint image (blob %s) are corrupt: %v: %w", desc.Digest, err, errdefs.ErrDataLoss)
	}
	// The rest of the blob (tar padding, the end of the compressed stream) counts for the
	// digest too.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("the CRIU images of the checkpoint image (blob %s) are corrupt: %v: %w", desc.Digest, err, errdefs.ErrDataLoss)
	}
	if _, err := io.Copy(io.Discard, raw); err != nil {
		return fmt.Errorf("CRIU images %s of the checkpoint image: %w", desc.Digest, err)
	}
	if !verifier.Verified() {
		return fmt.Errorf("the CRIU images of the checkpoint image (blob %s) are corrupt: the content does not match its digest: %w", desc.Digest, errdefs.ErrDataLoss)
	}
	return nil
}

// maxZstdWindow bounds the memory a blob's decompression takes: zstd keeps a window of the size
// the stream's header asks for, which containerd's decoder allows up to 512 MiB; cklite's
// exports ask for 8 MiB (the encoder's default).
const maxZstdWindow = 32 << 20

// decompress is compression.DecompressStream with zstd's window at most maxZstdWindow.
func decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReader(r)
	magic, err := br.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if compression.DetectCompression(magic) != compression.Zstd {
		return compression.DecompressStream(br)
	}
	zr, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(maxZstdWindow))
	if err != nil {
		return nil, err
	}
	return zr.IOReadCloser(), nil
}

func missing(desc ocispec.Descriptor, err error) error {
	return fmt.Errorf("the CRIU images of the checkpoint image (blob %s, %d bytes) are not in the content store (image not pulled completely?): %w", desc.Digest, desc.Size, err)
}

// diskReserve is the share of its filesystem (1/diskReserve of its bytes and of its inodes) that
// Untar leaves free: a blob is untrusted, and what it unpacks to is not bounded by its size (a
// compressed or sparse stream of zeros is tiny, so is a stream of empty entries), so an
// extraction must not fill the disk containerd and its containers write to, not even until it
// fails and its copy is removed.
const diskReserve = 20

// untarBudget is what Untar may take below dir: the free bytes and inodes of its filesystem less
// the reserve.
type untarBudget struct{ bytes, inodes int64 }

func newUntarBudget(dir string) (untarBudget, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return untarBudget{}, fmt.Errorf("free space below %s: %w", dir, err)
	}
	return budgetOf(st), nil
}

// budgetOf is the budget on a filesystem of statfs st. One that counts no inodes (btrfs, an
// unlimited tmpfs: 0 of 0 free) is bounded by its bytes alone.
func budgetOf(st unix.Statfs_t) untarBudget {
	bsize := int64(st.Bsize) //nolint:unconvert // int32 on 32-bit platforms
	b := untarBudget{
		bytes:  int64(st.Bavail)*bsize - int64(st.Blocks)*bsize/diskReserve,
		inodes: int64(st.Ffree) - int64(st.Files)/diskReserve,
	}
	if st.Files == 0 {
		b.inodes = math.MaxInt64
	}
	return b
}

// take charges tar entry h (an inode and its size) to b, and refuses it when b is spent.
func (b *untarBudget) take(h *tar.Header, dir string) error {
	b.bytes -= h.Size
	b.inodes--
	if b.bytes < 0 || b.inodes < 0 {
		return fmt.Errorf("tar entry %q (%d bytes) would leave less than 1/%d of the disk of %s free", h.Name, h.Size, diskReserve, dir)
	}
	return nil
}

// Untar writes the regular files and directories of the tar r below dir; anything else, a name
// leaving dir, or an entry that would leave less than 1/diskReserve of its filesystem free, is
// refused, the last before anything of it is written.
func Untar(r io.Reader, dir string) error {
	budget, err := newUntarBudget(dir)
	if err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(filepath.FromSlash(h.Name))
		if name == "." || filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("tar entry %q leaves the directory", h.Name)
		}
		if err := budget.take(h, dir); err != nil {
			return err
		}
		path := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := writeFile(path, tr, h.Size); err != nil {
				return err
			}
		default:
			return fmt.Errorf("tar entry %q is of type %c, not a file or directory", h.Name, h.Typeflag)
		}
	}
}

func writeFile(path string, r io.Reader, size int64) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != size {
		err = fmt.Errorf("%s: %d of %d bytes", path, n, size)
	}
	return err
}
