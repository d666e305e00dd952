// Package ckimage is cklite's checkpoint image: a checkpoint packed as an ordinary OCI image, so
// that registries, nerdctl, ctr and the CRI move it like any other and a node pulls only the
// layers it lacks.
//
// The manifest lists, in order:
//   - the layers of the image the checkpointed container ran (reused as they are: a registry that
//     holds that image stores nothing again);
//   - one layer per frozen layer of the checkpoint's chain, bottom first: each the diff of that
//     frozen layer against its parent, so a checkpoint stacked on an exported one adds only its
//     own delta. The chain exists only on the host that took the checkpoint, so that is where a
//     checkpoint is exported (a CRI archive's rootfs-diff.tar holds nothing for a cklite
//     checkpoint: the rw layer is frozen before containerd diffs it);
//   - the checkpoint's memory, one blob per checkpoint of its memory chain, bottom first: a
//     checkpoint whose memory is stored as what changed since its parent's (pkg/pagechain) has
//     one blob of MediaTypeCheckpointParent for each image directory up its chain, the root (a
//     full dump) first, and then its own of MediaTypeCheckpoint, last. Each is a zstd-compressed
//     tar of one CRIU image directory, cklite.json included, without its parent link, made
//     deterministically (sorted entries, fixed headers): the blob of a checkpoint is the same
//     bytes, so the same digest, in every image that holds it. So checkpoint N+1 exported after N
//     shares N's blobs, and a registry that has N's image stores and uploads only N+1's own.
//     They are not layer types, so containerd's unpacker fetches them but never applies them,
//     and the config's rootfs.diff_ids list only the real layers. An image of one checkpoint
//     blob and no parent is a self-contained dump (what exports before memory chains wrote).
//
// The config is the base image's with the entrypoint replaced by Marker, a path that exists in
// no rootfs and names what is missing: with any runtime but cklite the container fails to start
// with "exec: /cklite-checkpoint-image:requires-runtime-io.containerd.cklite.v2: no such file",
// and nothing half-restored runs. The cklite shim recognises Marker in Create and restores the
// checkpoint instead (shim/image_restore.go). The original entrypoint and cmd are kept in the
// config's labels, with the destinations of the checkpointed container's bind mounts: CRIU
// dumped those as external mounts, so a container without one of them is refused before CRIU
// fails on it (a CRI checkpoint restores into a CRI pod; ctr's and the Go client's default spec
// has no bind mounts, nerdctl's three).
//
// This package reads checkpoint images (what every shim links); package export writes them (what
// only the cklite CLI needs): kept apart, the shim does not carry the writing side's dependencies,
// which cost each shim ~1 MiB of resident memory.
package ckimage

import (
	"path"
	"slices"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const (
	// MediaTypeCheckpoint is the manifest entry holding the CRIU image directory.
	MediaTypeCheckpoint = "application/vnd.cklite.checkpoint.v1.tar+zstd"
	// MediaTypeCheckpointParent is a manifest entry holding an image directory of the memory
	// chain under the checkpoint's: a cklite that does not know it refuses the image (its
	// checkpoint blob has pages in a parent it lacks) rather than restoring half its memory.
	MediaTypeCheckpointParent = "application/vnd.cklite.checkpoint.parent.v1.tar+zstd"
	// Marker is the entrypoint of a checkpoint image.
	Marker = "/cklite-checkpoint-image:requires-runtime-io.containerd.cklite.v2"
)

// Labels of a checkpoint image's config.
const (
	LabelCheckpoint = "io.cklite.checkpoint"            // the checkpoint's id
	LabelEntrypoint = "io.cklite.checkpoint.entrypoint" // the base config's entrypoint, JSON
	LabelCmd        = "io.cklite.checkpoint.cmd"        // the base config's cmd, JSON
	LabelBase       = "io.cklite.checkpoint.base"       // the first image of the chain of checkpoints
	// LabelBindMounts lists, as JSON, the destinations of the checkpointed container's bind
	// mounts: CRIU dumped them as external mounts, and a restore must provide each.
	LabelBindMounts = "io.cklite.checkpoint.bind-mounts"
)

// BindMounts returns the destinations of spec's bind mounts, sorted.
func BindMounts(spec *specs.Spec) []string {
	var dsts []string
	for _, m := range spec.Mounts {
		if m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind") {
			dsts = append(dsts, path.Clean(m.Destination))
		}
	}
	slices.Sort(dsts)
	return slices.Compact(dsts)
}

// IsMemory reports whether a manifest entry is one of a checkpoint image's CRIU image blobs.
func IsMemory(d ocispec.Descriptor) bool {
	return d.MediaType == MediaTypeCheckpoint || d.MediaType == MediaTypeCheckpointParent
}

// IsMarker reports whether a process's args are a checkpoint image's entrypoint.
func IsMarker(args []string) bool {
	return len(args) > 0 && args[0] == Marker
}
