// Package diff is cklite's differ: a diff.Comparer whose Compare costs
// O(changes) instead of O(rootfs) for cklite's active snapshots.
//
// Every checkpoint through containerd's client (task.Checkpoint →
// rootfs.CreateDiff) diffs the container's rw snapshot against its parent.
// containerd's "walking" differ mounts both sides and walks both whole trees
// (continuity fs.Changes), so even an unchanged container pays for its whole
// rootfs while it stays frozen. A cklite active snapshot is an overlayfs whose
// upperdir already holds exactly the changes against its lowerdirs, so this
// differ walks only the upperdir, as continuity's fs.DiffDirChanges with
// DiffSourceOverlayFS (used by containerd's erofs differ) does, minus its
// flaws (see diffUpper): whiteouts (0/0 character devices) become OCI
// ".wh.<name>" entries and opaque directories (trusted.overlay.opaque=y)
// become ".wh..wh..opq". The lower layers are only looked up at the changed
// paths, to drop whiteouts that hide nothing and directories that were only
// copied up. The tar is written by containerd's archive.ChangeWriter,
// compressed and stored exactly as the walking differ does.
//
// The fast path is taken only when the mounts are recognisably cklite's:
//   - upper is a single overlay mount whose upperdir is under
//     <root>/snapshots/, or a single rw bind mount of a directory under
//     <root>/snapshots/ (an active snapshot without parent), and
//   - lower describes exactly the upper's lower layers: when the upper has
//     no lowerdir, no mounts or a bind mount of an empty directory (what
//     rootfs.CreateDiff's View of the parent "" gives); otherwise a single
//     bind mount of the upper's only lowerdir, or an overlay mount with the
//     same lowerdir list.
//
// Anything else (another snapshotter's mounts, idmapped layers, a lower that
// is not the upper's parent, an unsupported media type) falls through: Compare
// returns an error satisfying errdefs.IsNotImplemented, and containerd's diff
// service (plugins/services/diff/local.go, (*local).Diff) then tries the next
// differ of its "default" list, the stock "walking" one. The same happens when
// the upperdir holds overlay redirects or metacopy files, whose content lives
// in the lower layers: the walk stops, the partial upload is dropped, and
// walking produces the diff. Apply always falls through, so image unpack keeps
// using the stock applier.
package diff

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/containerd/v2/pkg/epoch"
	"github.com/containerd/containerd/v2/pkg/labels"
)

// uploadLeaseExpiry bounds the lease Compare takes (WithLeases) when the
// request carries none. containerd does not forward the client's lease to a
// proxy differ, so without it the committed blob is unreferenced until the
// client writes the checkpoint index that points at it, and a garbage
// collection in between would delete it. The index is written right after
// Compare returns; the expiry only has to cover that gap, and lets an
// abandoned checkpoint's blob be collected soon after.
const uploadLeaseExpiry = 10 * time.Minute

// Differ is a diff.Comparer and diff.Applier whose Compare walks only the
// upperdir of a cklite active snapshot; see the package documentation.
type Differ struct {
	// snapshots is "<root>/snapshots/": every cklite upperdir lies below it.
	snapshots string
	store     content.Store
	leases    leases.Manager
}

// Opt configures a Differ.
type Opt func(*Differ)

// WithLeases makes Compare protect each blob it uploads with a short-lived
// lease of m when the request carries no lease of its own. Needed when the
// Differ serves containerd as a proxy plugin (see uploadLeaseExpiry).
func WithLeases(m leases.Manager) Opt {
	return func(d *Differ) {
		d.leases = m
	}
}

// New returns a Differ for the snapshots of the cklite snapshotter rooted at
// root, uploading diffs into store.
func New(root string, store content.Store, opts ...Opt) *Differ {
	d := &Differ{
		snapshots: snapshotsDir(root),
		store:     store,
	}
	for _, o := range opts {
		o(d)
	}
	return d
}

var (
	_ diff.Comparer = (*Differ)(nil)
	_ diff.Applier  = (*Differ)(nil)
)

// Apply always returns NotImplemented: unpacking a layer gains nothing from
// cklite's layout, and NotImplemented hands it to the next differ.
func (d *Differ) Apply(context.Context, ocispec.Descriptor, []mount.Mount, ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	return ocispec.Descriptor{}, fmt.Errorf("cklite differ does not apply layers: %w", errdefs.ErrNotImplemented)
}

// Compare uploads the diff from lower to upper into the content store and
// returns its descriptor, or a NotImplemented error when the mounts are not a
// cklite active snapshot over its own parent.
func (d *Differ) Compare(ctx context.Context, lower, upper []mount.Mount, opts ...diff.Opt) (ocispec.Descriptor, error) {
	l, err := d.match(lower, upper)
	if err != nil {
		log.G(ctx).WithError(err).Debug("cklite differ: falling through")
		return ocispec.Descriptor{}, err
	}

	var config diff.Config
	for _, opt := range opts {
		if err := opt(&config); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	if tm := epoch.FromContext(ctx); tm != nil && config.SourceDateEpoch == nil {
		config.SourceDateEpoch = tm
	}
	compressionType, err := compressionFor(&config)
	if err != nil {
		return ocispec.Descriptor{}, err
	}

	if d.leases != nil {
		if _, ok := leases.FromContext(ctx); !ok {
			lease, err := d.leases.Create(ctx, leases.WithRandomID(), leases.WithExpiration(uploadLeaseExpiry))
			if err != nil {
				return ocispec.Descriptor{}, fmt.Errorf("failed to create upload lease: %w", err)
			}
			ctx = leases.WithLease(ctx, lease.ID)
		}
	}

	start := time.Now()
	desc, err := d.upload(ctx, &config, compressionType, func(w io.Writer) error {
		return l.writeDiff(ctx, w, config.SourceDateEpoch)
	})
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	log.G(ctx).WithFields(log.Fields{
		"upperdir": l.upperDir,
		"digest":   desc.Digest,
		"size":     desc.Size,
		"duration": time.Since(start),
	}).Debug("cklite differ: diffed upperdir")
	return desc, nil
}

// compressionFor validates config's media type and compressor the way the
// walking differ does (defaulting to gzip) and returns the compression to
// apply; compression.Unknown means config.Compressor.
func compressionFor(config *diff.Config) (compression.Compression, error) {
	if config.Compressor != nil {
		if config.MediaType == "" {
			return compression.Unknown, errors.New("media type must be explicitly specified when using custom compressor")
		}
		return compression.Unknown, nil
	}
	if config.MediaType == "" {
		config.MediaType = ocispec.MediaTypeImageLayerGzip
	}
	switch config.MediaType {
	case ocispec.MediaTypeImageLayer:
		return compression.Uncompressed, nil
	case ocispec.MediaTypeImageLayerGzip:
		return compression.Gzip, nil
	case ocispec.MediaTypeImageLayerZstd:
		return compression.Zstd, nil
	}
	return compression.Unknown, fmt.Errorf("unsupported diff media type: %v: %w", config.MediaType, errdefs.ErrNotImplemented)
}

// upload streams the tar written by writeTar through the compression into
// the content store, committing it with the labels the walking differ sets
// (the config's labels plus containerd.io/uncompressed), so that both
// differs are interchangeable for every consumer of the blob.
func (d *Differ) upload(ctx context.Context, config *diff.Config, compressionType compression.Compression, writeTar func(io.Writer) error) (_ ocispec.Descriptor, retErr error) {
	newReference := config.Reference == ""
	if newReference {
		config.Reference = uniqueRef()
	}
	cw, err := d.store.Writer(ctx,
		content.WithRef(config.Reference),
		content.WithDescriptor(ocispec.Descriptor{MediaType: config.MediaType}))
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("failed to open writer: %w", err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		cw.Close()
		// A caller-chosen reference stays: the next differ reuses it and
		// truncates it, as walking does.
		if newReference {
			if err := d.store.Abort(ctx, config.Reference); err != nil {
				log.G(ctx).WithError(err).WithField("ref", config.Reference).Warn("failed to delete diff upload")
			}
		}
	}()
	if !newReference {
		if err := cw.Truncate(0); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("failed to truncate upload %s: %w", config.Reference, err)
		}
	}

	if config.Labels == nil {
		config.Labels = map[string]string{}
	}
	if compressionType == compression.Uncompressed {
		if err := writeTar(cw); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("failed to write diff: %w", err)
		}
	} else {
		var compressed io.WriteCloser
		if config.Compressor != nil {
			compressed, err = config.Compressor(cw, config.MediaType)
		} else {
			compressed, err = compression.CompressStream(cw, compressionType)
		}
		if err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("failed to get compressed stream: %w", err)
		}
		dgstr := digest.SHA256.Digester()
		err = writeTar(io.MultiWriter(compressed, dgstr.Hash()))
		if cerr := compressed.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("failed to write compressed diff: %w", err)
		}
		config.Labels[labels.LabelUncompressed] = dgstr.Digest().String()
	}

	dgst := cw.Digest()
	if err := cw.Commit(ctx, 0, dgst, content.WithLabels(config.Labels)); err != nil && !errdefs.IsAlreadyExists(err) {
		return ocispec.Descriptor{}, fmt.Errorf("failed to commit: %w", err)
	}
	committed = true

	info, err := d.store.Info(ctx, dgst)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("failed to get info from content store: %w", err)
	}
	// A blob that already existed keeps its labels: add the uncompressed
	// digest if it lacks one, as walking does.
	if _, ok := info.Labels[labels.LabelUncompressed]; !ok {
		if info.Labels == nil {
			info.Labels = map[string]string{}
		}
		info.Labels[labels.LabelUncompressed] = config.Labels[labels.LabelUncompressed]
		if _, err := d.store.Update(ctx, info, "labels."+labels.LabelUncompressed); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("error setting uncompressed label: %w", err)
		}
	}
	return ocispec.Descriptor{
		MediaType: config.MediaType,
		Size:      info.Size,
		Digest:    info.Digest,
	}, nil
}

// uniqueRef is walking's ingest reference for callers that give none.
func uniqueRef() string {
	var b [3]byte
	// A failed read only makes the reference less unique.
	rand.Read(b[:])
	return fmt.Sprintf("%d-%s", time.Now().UnixNano(), base64.URLEncoding.EncodeToString(b[:]))
}
