package shim

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/api/types/runc/options"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/pelletier/go-toml/v2"
)

// defaultRoot is libcontainer's state root, per namespace, where runc-v2 keeps runc's.
const defaultRoot = "/run/containerd/runc"

// decodeOptions accepts what the daemon sends as a task's runtime options: nothing,
// containerd's runc Options (cklite speaks the runc shim's option types so every client works
// unchanged), or the CRI plugin's runtimeoptions holding runc's options as TOML. Anything else is
// refused by name rather than silently ignored.
func decodeOptions(a typeurl.Any) (*options.Options, error) {
	var (
		o   *options.Options
		err error
	)
	if a != nil && a.GetTypeUrl() == runtimeOptionsType {
		o, err = fromRuntimeOptions(a)
	} else {
		o, err = decodeAs[options.Options](a, "containerd.runc.v1.Options")
	}
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

// runtimeOptionsType is what the CRI plugin sends a runtime whose type is not runc's: the
// runtime's options table of containerd's configuration, as TOML (ConfigBody) or in a file
// (ConfigPath).
const runtimeOptionsType = "runtimeoptions.v1.Options"

// fromRuntimeOptions reads runc's options from the TOML the CRI plugin passes (the same keys as
// for the runc runtime: NoPivotRoot, Root, IoUid, ...); unknown keys are refused by name.
func fromRuntimeOptions(a typeurl.Any) (*options.Options, error) {
	ro, err := decodeAs[runtimeoptions.Options](a, runtimeOptionsType)
	if err != nil {
		return nil, err
	}
	body, source := ro.ConfigBody, "the CRI runtime's options"
	if ro.ConfigPath != "" {
		if body, err = os.ReadFile(ro.ConfigPath); err != nil {
			return nil, fmt.Errorf("runtime options file: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		source = ro.ConfigPath
	}
	var o options.Options
	d := toml.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(&o); err != nil {
		return nil, fmt.Errorf("%s are not runc options: %w: %w", source, err, errdefs.ErrInvalidArgument)
	}
	return &o, nil
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
