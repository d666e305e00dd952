package shim

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/criuimage"
	"github.com/cklite/cklite/pkg/pagechain"
)

// Memory stored as what changed (pkg/pagechain): once a checkpoint is taken and its task runs
// again, the shim rewrites the checkpoint's dump so that the pages equal to its parent
// checkpoint's are read from the parent's image directory, then compresses its small pages
// files. For a container that has been rolled back in place (a tree search, an agent undoing its
// steps: likely to be rolled back again), it then makes the copies a restore of the checkpoint
// reads (pagechain.Materialise), so that the rollback does not, while its task is down; other
// containers' checkpoints keep no decompressed copy until a restore asks. Only image directories
// in cklite's own checkpoints directory of the namespace (`cklite checkpoint create`'s) take
// part, as child and as parent: a directory a client named is the client's, and may be moved or
// removed by means that know nothing of the chain.

// dedupMu runs one deduplication at a time in a shim: each reads two dumps.
var dedupMu sync.Mutex

// dedupLineage bounds how far up the container's lineage a parent with a memory dump is looked for.
const dedupLineage = 4

// dedupPages deduplicates checkpoint run ck's image directory against its parent's, in the
// background, and writes what it did into the directory (pagechain.ReportFile).
func (s *service) dedupPages(ctx context.Context, ns string, ck *checkpointRun) {
	if ck.opts.ImagePath == "" {
		return // the daemon's temporary directory, gone with the call
	}
	ctx = namespaces.WithNamespace(context.WithoutCancel(ctx), ns)
	dir := ck.path
	warm := ck.c.rolledBack.Load()
	go func() {
		dedupMu.Lock()
		defer dedupMu.Unlock()
		start := time.Now()
		r := s.dedup(ctx, ns, dir, warm)
		r.TookMs = time.Since(start).Milliseconds()
		l := log.G(ctx).WithFields(log.Fields{"dir": dir, "parent": r.Parent, "inParent": r.InParent, "present": r.Present,
			"bytesBefore": r.BytesBefore, "bytesAfter": r.BytesAfter, "compressedTo": r.Compressed.BytesAfter, "took": time.Since(start)})
		if r.Skipped != "" {
			l = l.WithField("skipped", r.Skipped)
		}
		l.Info("checkpoint memory deduplicated")
		if err := pagechain.WriteReport(dir, r); err != nil {
			log.G(ctx).WithError(err).Warn("checkpoint memory deduplication")
		}
	}()
}

// dedup deduplicates dir against the nearest checkpoint of its lineage that has a memory dump in
// the same checkpoints directory, and compresses it; warm: then makes its restore copies.
func (s *service) dedup(ctx context.Context, ns, dir string, warm bool) pagechain.Report {
	skip := func(why string, args ...any) pagechain.Report {
		return pagechain.Report{Skipped: fmt.Sprintf(why, args...)}
	}
	cfg, err := s.config.get()
	if err != nil {
		return skip("%v", err)
	}
	if !cfg.DedupMemoryOn() {
		return skip("dedup_memory = false")
	}
	meta, err := checkpoint.Read(dir)
	if err != nil {
		return skip("%v", err)
	}
	if !meta.Contents.HasMemory() {
		return skip("no memory dump")
	}
	inst, err := s.daemon.instance(ctx, cfg.StateDir)
	if err != nil {
		return skip("%v", err)
	}
	root, err := inst.NamespaceCheckpoints(ns)
	if err != nil {
		return skip("%v", err)
	}
	if filepath.Dir(filepath.Clean(dir)) != root {
		return skip("not in cklite's checkpoints directory %s", root)
	}
	id, pdir, err := s.memoryParent(ctx, ns, meta, root)
	if err != nil {
		return skip("%v", err)
	}
	r := pagechain.Report{Parent: id}
	if id == "" {
		r.Skipped = fmt.Sprintf("no checkpoint of its lineage has a memory dump in %s", root)
	} else if res, err := pagechain.Dedup(dir, pdir); err != nil {
		r.Skipped = err.Error()
	} else {
		r.Result = res
	}
	// Deduplicated or not, the small pages files are stored compressed: a restore materialises
	// them (pagechain.OpenRestore).
	if r.Compressed, err = pagechain.Compress(dir); err != nil {
		log.G(ctx).WithError(err).WithField("dir", dir).Warn("compress checkpoint memory")
	} else if warm {
		if err := pagechain.Materialise(dir); err != nil {
			log.G(ctx).WithError(err).WithField("dir", dir).Warn("materialise checkpoint memory for its restores")
		}
	}
	return r
}

// memoryParent is the nearest checkpoint of meta's lineage with a memory dump in root, and its
// image directory; "" when there is none.
func (s *service) memoryParent(ctx context.Context, ns string, meta checkpoint.Meta, root string) (string, string, error) {
	lm, err := s.daemon.leases()
	if err != nil {
		return "", "", err
	}
	lineage := checkpoint.ParseLineage(meta.Lineage)
	for _, id := range lineage[:min(len(lineage), dedupLineage)] {
		ls, err := lm.List(ctx, fmt.Sprintf("id==%q", checkpoint.LeaseID(id)))
		if err != nil {
			return "", "", fmt.Errorf("look up checkpoint %s: %w", id, err)
		}
		if len(ls) != 1 {
			continue // removed or expired
		}
		r, err := checkpoint.FromLease(ns, ls[0])
		if err != nil || !r.Contents.HasMemory() || r.ImagePath == "" || filepath.Dir(filepath.Clean(r.ImagePath)) != root {
			continue
		}
		if m, err := checkpoint.Read(r.ImagePath); err != nil || m.ID != id {
			continue // the directory is gone or holds another checkpoint
		}
		return id, r.ImagePath, nil
	}
	return "", "", nil
}

// admitChain is admitImages for this shim's containerd: an image directory whose pages are partly
// in parent image directories is admitted when the whole chain is in cklite's checkpoints
// directory, or in its checkpoint image cache. The chain is read-locked meanwhile: no deduplication rewrites it under the check.
// With rootfs (the container's, mounted), the spec's mount destinations are resolved in it.
func (s *service) admitChain(dir string, spec *specs.Spec, rootfs string) error {
	var opts []criuimage.AdmitOption
	if rootfs != "" {
		opts = append(opts, criuimage.ResolveIn(rootfs))
	}
	l, err := pagechain.ReadLock(dir)
	if err != nil {
		return admitImages(dir, spec, opts...) // no directory to lock: it says why
	}
	defer l.Unlock()
	if len(l.Dirs) > 1 {
		cfg, err := s.config.get()
		if err != nil {
			return err
		}
		inst, err := s.daemon.instance(s.ctx, cfg.StateDir)
		if err != nil {
			return fmt.Errorf("checkpoint image %s has a parent image directory, whose place cannot be checked: %w", dir, err)
		}
		// A checkpoint image's chain is extracted into the image cache (image_restore.go), the
		// chains cklite deduplicated are in its checkpoints directory: neither may leave its own.
		root := inst.Checkpoints()
		if below(dir, inst.ImageCache()) {
			root = inst.ImageCache()
		}
		opts = append(opts, criuimage.ParentsUnder(root))
	}
	return admitImages(dir, spec, opts...)
}

// below reports whether path lies below dir, both cleaned as they are (admission resolves links).
func below(path, dir string) bool {
	rel, err := filepath.Rel(filepath.Clean(dir), filepath.Clean(path))
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}
