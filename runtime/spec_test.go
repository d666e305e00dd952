package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestNewConfig(t *testing.T) {
	bundle := t.TempDir()
	if err := os.Mkdir(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	valid := func() *specs.Spec {
		s := specconv.Example()
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: "data", Options: []string{"rbind"}})
		return s
	}
	for _, tc := range []struct {
		name    string
		mutate  func(*specs.Spec)
		wantErr error
	}{
		{"valid", func(*specs.Spec) {}, nil},
		{"no root", func(s *specs.Spec) { s.Root = nil }, errdefs.ErrInvalidArgument},
		{"no process", func(s *specs.Spec) { s.Process = nil }, errdefs.ErrInvalidArgument},
		{"no linux", func(s *specs.Spec) { s.Linux = nil }, errdefs.ErrInvalidArgument},
		{"missing rootfs", func(s *specs.Spec) { s.Root.Path = "nope" }, errdefs.ErrInvalidArgument},
		{"bad namespace", func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: "bogus"})
		}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := valid()
			tc.mutate(s)
			cfg, err := NewConfig(bundle, s, ConfigOptions{ID: "c1"})
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Rootfs != filepath.Join(bundle, "rootfs") {
				t.Fatalf("rootfs %q not absolute in bundle", cfg.Rootfs)
			}
			last := cfg.Mounts[len(cfg.Mounts)-1]
			if last.Source != filepath.Join(bundle, "data") {
				t.Fatalf("bind source %q not absolute in bundle", last.Source)
			}
		})
	}
}

func TestNewProcess(t *testing.T) {
	p := specconv.Example().Process
	p.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 10, Soft: 5}}
	lp, err := NewProcess(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(lp.Rlimits) != 1 || lp.Rlimits[0].Hard != 10 || lp.Rlimits[0].Soft != 5 {
		t.Fatalf("rlimits %+v", lp.Rlimits)
	}
	p.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_BOGUS"}}
	if _, err := NewProcess(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bogus rlimit: %v", err)
	}
	for name, bad := range map[string]*specs.Process{
		"nil":          nil,
		"no cwd":       {Args: []string{"sh"}},
		"relative cwd": {Args: []string{"sh"}, Cwd: "rel"},
		"no args":      {Cwd: "/"},
	} {
		if _, err := NewProcess(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
