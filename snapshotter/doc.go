// Package snapshotter is cklite's overlay snapshotter, served to containerd as the proxy
// snapshotter "cklite" by cmd/cklite-snapshotter. For every ordinary operation it behaves as
// containerd's overlayfs snapshotter (same directory layout, same mounts, same bolt metadata via
// containerd's snapshots/storage); it differs where checkpoints need it:
//
//   - Commit is O(1). A container's upper directory becomes a committed layer as it is: nothing
//     is walked (usage is measured on first request) or copied. Commit followed by Prepare of the
//     same key on the new layer is a freeze (package freeze): a checkpoint of the filesystem that
//     stores only what changed since the previous one. Commit refuses an upper that is still
//     mounted, which would keep changing after the freeze.
//   - Rollback and fork are Prepare on a frozen layer: any number of independent active
//     snapshots on one chain.
//   - Deep chains stay mountable: every DefaultFanOut layers are also merged into one directory
//     of hard links, so a chain of thousands of freezes mounts with a few dozen lower layers
//     (merge.go, apply.go).
//   - With WithDedup, identical files of committed layers share one inode (dedup.go).
//
// Layout under the root: metadata.db (bolt), snapshots/<id>/{fs,work} (a snapshot's layer and
// overlay work directory), snapshots/m<id>-<n>/fs (a merge of n layers topped by layer id),
// dedup/ (the dedup store). Every directory is made under a temporary name and renamed into
// place, and New removes whatever the metadata does not name, so a snapshotter killed at any
// point restarts consistent.
//
// On kernels without overlayfs redirect_dir (as on cklite's reference machines), renaming a
// directory that comes from a lower layer fails with EXDEV, as with containerd's overlayfs
// snapshotter: tools fall back to copying (mv does), and containerd's conformance suite fails
// its Rename case on both.
package snapshotter
