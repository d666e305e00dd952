// Package podckpt is the record of a pod checkpoint: every container of one CRI pod sandbox
// checkpointed at one instant, and the pod's emptyDir volumes copied at that instant, kept as one
// checkpoint with one id.
//
// A pod checkpoint is taken in three phases (pkg/client's PodCheckpoint drives them through
// containerd's task API, one call per container, whichever shim serves it):
//
//  1. Freeze: every container of the pod is paused (task Pause: its cgroup frozen). Only once all
//     are frozen does anything get recorded, so what is recorded is the state of all of them at
//     the instant the last froze; a container frozen earlier simply did not move since.
//  2. Capture: the volumes are copied (Copy, below), then the containers are checkpointed, all at
//     once (task Checkpoint, leaving them running). A cklite shim given a task its client paused dumps it with
//     CRIU and captures its rootfs upper without thawing it (shim/capture.go): the "freeze, dump,
//     leave frozen" a pod checkpoint needs is the shim's ordinary checkpoint of a paused task.
//  3. Thaw: every container is resumed (task Resume), whatever failed before.
//
// This works the same whether each container has a shim of its own (cklite's shim starts one per
// container: its manager groups by the task's instance id, not by the CRI sandbox annotation as
// runc-v2's does) or one shim serves the whole pod: every call names one container.
//
// The pod's pause (sandbox) container is not checkpointed: it holds the pod's namespaces and no
// state. A restore in place keeps it; a fork runs a new sandbox with the recorded configuration.
//
// Volumes: a pod's emptyDirs live outside every rootfs (the kubelet's
// /var/lib/kubelet/pods/UID/volumes/kubernetes.io~empty-dir/NAME, bind-mounted into the
// containers), so the rootfs capture does not see them. Copy copies each into the record's
// directory while the pod is frozen. On a file system with reflinks (XFS, btrfs) each file is a
// clone (FICLONE), O(1) in its size; ext4 has none, so there it is an in-kernel copy
// (copy_file_range), O(bytes). Hard links would be O(1) on ext4 but are no snapshot: a file
// written in place after the thaw (an appended log) would change the checkpoint's copy too.
//
// The record (Record) is pod.json in the pod checkpoint's directory, next to the members' CRIU
// image directories and the volume copies: POD_DIR/pod.json, POD_DIR/MEMBER/ (CRIU images),
// POD_DIR/volumes/N/. Each member is an ordinary cklite checkpoint (its lease holds its frozen
// layer) carrying the label pod-checkpoint=ID, so `cklite checkpoint ls --label` finds them.
package podckpt
