package shim

import (
	"context"
	"fmt"
	"time"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	contentapi "github.com/containerd/containerd/api/services/content/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	contentproxy "github.com/containerd/containerd/v2/core/content/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/ckimage"
)

// imageCacheTTL is how long an extracted checkpoint image stays in the cache after its last use
// (a Create from it). A restore reads it at Start: a Create left unstarted for longer fails.
const imageCacheTTL = 24 * time.Hour

// imageCheckpoint returns the CRIU image directory of the checkpoint image container id was made
// from (its entrypoint is ckimage.Marker): the image's CRIU blob, extracted once into this containerd's
// cache (pkg/paths). Its rootfs, prepared by the client from the image's layers, is already the checkpoint's
// filesystem, so the restore needs nothing else: the same node restores on layers it unpacked
// from its own frozen chain, any other node on the layers it pulled. A checkpoint whose memory is
// stored as what changed since its parent's is extracted as a chain of image directories in the
// cache, admitted at the restore as a chain below the cache (admitChain).
func (s *service) imageCheckpoint(ctx context.Context, ns, id string, spec *specs.Spec) (string, error) {
	start := time.Now()
	ctx = namespaces.WithNamespace(ctx, ns)
	conn, err := s.daemon.dial()
	if err != nil {
		return "", err
	}
	c, err := containersapi.NewContainersClient(conn).Get(ctx, &containersapi.GetContainerRequest{ID: id})
	if err != nil {
		return "", fmt.Errorf("look up container %s in containerd: %w", id, errgrpc.ToNative(err))
	}
	name := c.Container.Image
	if name == "" {
		return "", fmt.Errorf("container %s runs the entrypoint of a cklite checkpoint image, but names no image to restore from", id)
	}
	img, err := imagesapi.NewImagesClient(conn).Get(ctx, &imagesapi.GetImageRequest{Name: name})
	if err != nil {
		return "", fmt.Errorf("checkpoint image %s of container %s: %w", name, id, errgrpc.ToNative(err))
	}
	target := oci.DescriptorFromProto(img.Image.Target)
	cs := contentproxy.NewContentStore(contentapi.NewContentClient(conn))
	ck, err := ckimage.Find(ctx, cs, name, target, platforms.Default())
	if err != nil {
		return "", err
	}
	if err := ck.CheckMounts(spec); err != nil {
		return "", fmt.Errorf("container %s: %w", id, err)
	}
	cfg, err := s.config.get()
	if err != nil {
		return "", err
	}
	inst, err := s.daemon.instance(ctx, cfg.StateDir)
	if err != nil {
		return "", err
	}
	cache := inst.ImageCache()
	dir, err := ckimage.Extract(ctx, cs, ck.Chain(), cache)
	if err != nil {
		return "", fmt.Errorf("checkpoint image %s: %w", name, err)
	}
	log.G(ctx).WithFields(log.Fields{"image": name, "dir": dir, "took": time.Since(start)}).Info("restoring from a checkpoint image")
	// Off the Create path: a prune may remove gigabytes of old copies.
	go func() {
		if err := ckimage.PruneCache(cache, imageCacheTTL); err != nil {
			log.G(ctx).WithError(err).Warn("prune the checkpoint image cache")
		}
	}()
	return dir, nil
}
