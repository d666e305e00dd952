package shim

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/api/types/runc/options"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/anypb"
)

func mustAny(t *testing.T, v any) *anypb.Any {
	t.Helper()
	a, err := typeurl.MarshalAnyToProto(v)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestDecodeOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      typeurl.Any
		want    *options.Options
		wantErr error
	}{
		{"nil", nil, &options.Options{}, nil},
		{"empty any", &anypb.Any{}, &options.Options{}, nil},
		{"runc options", mustAny(t, &options.Options{Root: "/r", IoUid: 7, NoPivotRoot: true}), &options.Options{Root: "/r", IoUid: 7, NoPivotRoot: true}, nil},
		{"binary name ignored", mustAny(t, &options.Options{BinaryName: "crun"}), &options.Options{BinaryName: "crun"}, nil},
		{"checkpoint options are not runtime options", mustAny(t, &options.CheckpointOptions{Exit: true}), nil, errdefs.ErrInvalidArgument},
		{"systemd cgroup refused", mustAny(t, &options.Options{SystemdCgroup: true}), nil, errdefs.ErrNotImplemented},
		{"unknown type", &anypb.Any{TypeUrl: "example.com/Nope", Value: []byte{1}}, nil, errdefs.ErrInvalidArgument},
		{"CRI runtime options", mustAny(t, &runtimeoptions.Options{ConfigBody: []byte("NoPivotRoot = true\nRoot = \"/r\"\nIoUid = 7\n")}), &options.Options{Root: "/r", IoUid: 7, NoPivotRoot: true}, nil},
		{"CRI runtime options, empty", mustAny(t, &runtimeoptions.Options{}), &options.Options{}, nil},
		{"CRI runtime options file", mustAny(t, &runtimeoptions.Options{ConfigPath: criOptionsFile(t, `Root = "/f"`)}), &options.Options{Root: "/f"}, nil},
		{"CRI runtime options file missing", mustAny(t, &runtimeoptions.Options{ConfigPath: "/nonexistent/opts.toml"}), nil, errdefs.ErrInvalidArgument},
		{"CRI runtime options, unknown key", mustAny(t, &runtimeoptions.Options{ConfigBody: []byte("Bogus = 1\n")}), nil, errdefs.ErrInvalidArgument},
		{"CRI runtime options, systemd cgroup refused", mustAny(t, &runtimeoptions.Options{ConfigBody: []byte("SystemdCgroup = true\n")}), nil, errdefs.ErrNotImplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeOptions(tc.in)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Root != tc.want.Root || got.IoUid != tc.want.IoUid || got.NoPivotRoot != tc.want.NoPivotRoot || got.BinaryName != tc.want.BinaryName {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeCheckpointOptions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       typeurl.Any
		wantExit bool
		wantErr  bool
	}{
		{"nil (nerdctl for non-runc runtimes)", nil, false, false},
		{"exit", mustAny(t, &options.CheckpointOptions{Exit: true, ImagePath: "/x"}), true, false},
		{"runtime options refused", mustAny(t, &options.Options{}), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeCheckpointOptions(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if err == nil && got.Exit != tc.wantExit {
				t.Fatalf("Exit = %v", got.Exit)
			}
		})
	}
}

func TestStateRoot(t *testing.T) {
	if got := stateRoot(&options.Options{}, "ns"); got != "/run/containerd/runc/ns" {
		t.Fatal(got)
	}
	if got := stateRoot(&options.Options{Root: "/x"}, "ns"); got != "/x/ns" {
		t.Fatal(got)
	}
}

// criOptionsFile writes a runtime options file, as ConfigPath names one.
func criOptionsFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "opts.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
