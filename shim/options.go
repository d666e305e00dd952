package shim

import (
	"fmt"
	"path/filepath"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
)

// defaultRoot is libcontainer's state root, per namespace, where runc-v2 keeps runc's.
const defaultRoot = "/run/containerd/runc"

// decodeOptions accepts what the daemon sends as a task's runtime options: nothing, or
// containerd's runc Options (cklite speaks the runc shim's option types so every client works
// unchanged). Anything else is refused by name rather than silently ignored.
func decodeOptions(a typeurl.Any) (*options.Options, error) {
	o, err := decodeAs[options.Options](a, "containerd.runc.v1.Options")
	if err != nil {
		return nil, err
	}
	if o.SystemdCgroup {
		// libcontainer's systemd driver needs systemd as PID 1 on the host; cklite runs the
		// cgroupfs driver only and says so instead of half-working.
		return nil, fmt.Errorf("SystemdCgroup is not supported by the cklite shim (cgroupfs only): %w", errdefs.ErrNotImplemented)
	}
	return o, nil
}

// decodeCheckpointOptions accepts nothing or containerd's runc CheckpointOptions (nerdctl sends
// nothing for non-runc runtimes; the daemon only knows this type).
func decodeCheckpointOptions(a typeurl.Any) (*options.CheckpointOptions, error) {
	return decodeAs[options.CheckpointOptions](a, "containerd.runc.v1.CheckpointOptions")
}

// decodeAs decodes an Any that must be a *T (named want in errors); nothing decodes as a zero T.
func decodeAs[T any](a typeurl.Any, want string) (*T, error) {
	if a == nil || (a.GetTypeUrl() == "" && len(a.GetValue()) == 0) {
		return new(T), nil
	}
	v, err := typeurl.UnmarshalAny(a)
	if err != nil {
		return nil, fmt.Errorf("decode options of type %s: %w: %w", a.GetTypeUrl(), err, errdefs.ErrInvalidArgument)
	}
	o, ok := v.(*T)
	if !ok {
		return nil, fmt.Errorf("unsupported options type %s (want %s): %w", a.GetTypeUrl(), want, errdefs.ErrInvalidArgument)
	}
	return o, nil
}

// stateRoot is where libcontainer keeps the container's state.
func stateRoot(o *options.Options, namespace string) string {
	if o.Root != "" {
		return filepath.Join(o.Root, namespace)
	}
	return filepath.Join(defaultRoot, namespace)
}
