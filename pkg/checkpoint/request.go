package checkpoint

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
)

// Keys a client sets, as a container label or an OCI annotation, to shape the container's
// checkpoints when it cannot pass flags (nerdctl and the CRI pass no cklite options). A label
// wins over the annotation: labels can change after the container is created.
const (
	ContentsKey = "cklite.io/checkpoint-contents" // memory+fs (default), fs or memory
	TTLKey      = "cklite.io/checkpoint-ttl"      // a Go duration: the checkpoint expires after it
)

// RollbackKey is the annotation of a task Update (containerd's UpdateTaskRequest.Annotations)
// that asks the shim to roll the running task back, in place, to the checkpoint in the image
// directory it names: the task API has no call for it, and Update reaches the shim unchanged.
const RollbackKey = "cklite.io/rollback"

func requested(key string, annotations, labels map[string]string) string {
	if v, ok := labels[key]; ok {
		return v
	}
	return annotations[key]
}

// RequestedContents is what the container's checkpoints capture.
func RequestedContents(annotations, labels map[string]string) (Contents, error) {
	return ParseContents(requested(ContentsKey, annotations, labels))
}

// RequestedTTL is how long the container's checkpoints live; ok is false when no TTL is set.
func RequestedTTL(annotations, labels map[string]string) (ttl time.Duration, ok bool, err error) {
	v := requested(TTLKey, annotations, labels)
	if v == "" {
		return 0, false, nil
	}
	ttl, err = time.ParseDuration(v)
	if err != nil || ttl <= 0 {
		return 0, false, fmt.Errorf("%s=%q: want a positive duration such as 24h: %w", TTLKey, v, errdefs.ErrInvalidArgument)
	}
	return ttl, true, nil
}

// Runtime is the runtime of the containers cklite checkpoints, rolls back and forks. Another
// runtime's shim does not know RollbackKey (the stock runc shim crashes on it and takes the
// container with it) and writes no Meta.
const Runtime = "io.containerd.cklite.v2"

// CheckRuntime refuses container id when its runtime, as containerd records it (a name or the
// shim binary's path), is not Runtime: errdefs.ErrNotImplemented naming what it runs on.
func CheckRuntime(id, runtime string) error {
	if runtime == Runtime || filepath.Base(runtime) == "containerd-shim-cklite-v2" {
		return nil
	}
	return fmt.Errorf("container %s runs on %s; cklite checkpoints, rolls back and forks only containers of runtime %s "+
		"(use the runtime's own checkpoint and restore, e.g. nerdctl checkpoint create, or recreate the container with --runtime %s): %w",
		id, runtime, Runtime, Runtime, errdefs.ErrNotImplemented)
}
