package shim

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/containerd/containerd/api/types/runc/options"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	features "github.com/opencontainers/runtime-spec/specs-go/features"
	"google.golang.org/protobuf/proto"
)

// TestInfoOptionsForms feeds `-info` each form containerd writes to its stdin: nothing (a handler
// without an options table), runc's Options (runtime type io.containerd.runc.v2 with cklite's
// runtime_path), and runtimeoptions.v1.Options (any other runtime type, io.containerd.cklite.v2
// included) with the options table as TOML or in a file. Each must give the engine's features,
// recursive read-only mounts and user namespaces included, as CRI reads them.
func TestInfoOptionsForms(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stdin    []byte
		wantRoot string
		wantErr  error
	}{
		{"nothing", nil, "", nil},
		{"runc options", marshalAny(t, &options.Options{Root: "/r"}), "/r", nil},
		{"runc options, empty", marshalAny(t, &options.Options{}), "", nil},
		// contrib/kubernetes/containerd-cri.toml's table, as containerd's CRI marshals it.
		{"CRI runtime options, contrib's table", marshalAny(t, &runtimeoptions.Options{ConfigBody: []byte("SystemdCgroup = false\n")}), "", nil},
		{"CRI runtime options, root", marshalAny(t, &runtimeoptions.Options{ConfigBody: []byte("Root = \"/r\"\n")}), "/r", nil},
		{"CRI runtime options file", marshalAny(t, &runtimeoptions.Options{ConfigPath: criOptionsFile(t, `Root = "/f"`)}), "/f", nil},
		{"not an Any", []byte{0xff, 0xff, 0xff}, "", errdefs.ErrInvalidArgument},
		{"unknown type", marshalAny(t, &runtimeoptions.Options{ConfigBody: []byte("Bogus = 1\n")}), "", errdefs.ErrInvalidArgument},
		{"systemd cgroup refused", marshalAny(t, &options.Options{SystemdCgroup: true}), "", errdefs.ErrNotImplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, err := manager{}.Info(context.Background(), bytes.NewReader(tc.stdin))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if info.Name != RuntimeName {
				t.Errorf("name = %q", info.Name)
			}
			if tc.stdin == nil {
				if info.Options != nil {
					t.Errorf("options = %v for no input", info.Options)
				}
			} else {
				var o options.Options
				if err := typeurl.UnmarshalTo(info.Options, &o); err != nil {
					t.Fatalf("options: %v", err)
				}
				if o.Root != tc.wantRoot {
					t.Errorf("options root = %q, want %q", o.Root, tc.wantRoot)
				}
			}
			f, err := typeurl.UnmarshalAny(info.Features)
			if err != nil {
				t.Fatal(err)
			}
			feat, ok := f.(*features.Features)
			if !ok {
				t.Fatalf("features are %T", f)
			}
			if !slices.Contains(feat.MountOptions, "rro") {
				t.Error("no rro mount option: CRI would skip recursive read-only mounts")
			}
			if feat.Linux == nil || !slices.Contains(feat.Linux.Namespaces, "user") ||
				feat.Linux.MountExtensions == nil || feat.Linux.MountExtensions.IDMap == nil ||
				feat.Linux.MountExtensions.IDMap.Enabled == nil || !*feat.Linux.MountExtensions.IDMap.Enabled {
				t.Error("no user namespaces with idmap mounts: CRI would refuse user-namespaced pods")
			}
		})
	}
}

// marshalAny is what containerd writes to `-info`'s stdin: proto.Marshal of the options' Any.
func marshalAny(t *testing.T, v any) []byte {
	t.Helper()
	b, err := proto.Marshal(mustAny(t, v))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
