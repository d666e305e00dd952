package shim

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/config"
	"github.com/cklite/cklite/pkg/exechelper"
)

func TestUseInit(t *testing.T) {
	on, off := true, false
	for _, tc := range []struct {
		name       string
		annotation string // "": none
		config     *bool
		configErr  error
		sharedPid  bool
		sandbox    bool
		meta       *checkpoint.Meta
		want       bool
		wantErr    string
	}{
		{name: "default off"},
		{name: "configured on", config: &on, want: true},
		{name: "configured off", config: &off},
		{name: "annotation on", annotation: "true", want: true},
		{name: "annotation off over the configuration", annotation: "false", config: &on},
		{name: "annotation on, configuration unreadable", annotation: "true", configErr: errors.New("bad toml"), want: true},
		{name: "configuration unreadable", configErr: errors.New("bad toml"), wantErr: "bad toml"},
		{name: "bad annotation", annotation: "yes", wantErr: "want true or false"},
		{name: "shared PID namespace", annotation: "true", sharedPid: true},
		{name: "pod sandbox", annotation: "true", sandbox: true},
		{name: "dumped with the init", meta: &checkpoint.Meta{Contents: checkpoint.MemoryAndFS, Init: true}, want: true},
		{name: "dumped without, annotation on", annotation: "true", meta: &checkpoint.Meta{Contents: checkpoint.MemoryOnly}},
		{name: "filesystem only: a fresh start", annotation: "true", meta: &checkpoint.Meta{Contents: checkpoint.FSOnly}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &service{config: shimConfig{cfg: config.Shim{Init: tc.config}, err: tc.configErr}}
			c := &container{id: "c", sharedPid: tc.sharedPid, spec: &specs.Spec{Annotations: map[string]string{}}}
			if tc.annotation != "" {
				c.spec.Annotations[initAnnotation] = tc.annotation
			}
			if tc.sandbox {
				c.spec.Annotations[criContainerType] = "sandbox"
			}
			got, err := s.useInit(c, tc.meta)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("useInit = %v, %v; want an error saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("useInit = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestWithInit(t *testing.T) {
	dev := specs.Mount{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"}
	spec := &specs.Spec{Process: &specs.Process{Args: []string{"sleep", "1"}}, Mounts: []specs.Mount{dev}}
	original := spec.Process
	if err := withInit(spec, "/opt/cklite/bin/cklite-exec-helper"); err != nil {
		t.Fatal(err)
	}
	if want := []string{exechelper.InitPath, "--", "sleep", "1"}; !slices.Equal(spec.Process.Args, want) {
		t.Fatalf("args %q, want %q", spec.Process.Args, want)
	}
	if !slices.Equal(original.Args, []string{"sleep", "1"}) {
		t.Fatalf("the original process was changed: %q", original.Args)
	}
	last := spec.Mounts[len(spec.Mounts)-1]
	if len(spec.Mounts) != 2 || last.Destination != exechelper.InitPath || last.Source != "/opt/cklite/bin/cklite-exec-helper" || !slices.Contains(last.Options, "ro") {
		t.Fatalf("mounts %+v: want /dev and the init's read-only bind mount after it", spec.Mounts)
	}

	noDev := &specs.Spec{Process: &specs.Process{Args: []string{"sleep", "1"}}}
	if err := withInit(noDev, "/x"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("withInit without a /dev tmpfs: %v, want InvalidArgument", err)
	}
	noArgs := &specs.Spec{Process: &specs.Process{}, Mounts: []specs.Mount{dev}}
	if err := withInit(noArgs, "/x"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("withInit without args: %v, want InvalidArgument", err)
	}
}

func TestSameInit(t *testing.T) {
	self, err := os.Executable() // a Go binary, as the helper
	if err != nil {
		t.Fatal(err)
	}
	build, err := goBuildID(self)
	if err != nil || build == "" {
		t.Fatalf("goBuildID of the test binary: %q, %v; want its build id", build, err)
	}
	for _, tc := range []struct {
		name            string
		running, dumped bool
		dumpedBuild     string // the helper's build in the checkpoint ("": none recorded)
		refused         string // "": accepted
	}{
		{name: "neither"},
		{name: "both, the same build", running: true, dumped: true, dumpedBuild: build},
		{name: "both, no build recorded", running: true, dumped: true},
		{name: "both, the helper replaced since", running: true, dumped: true, dumpedBuild: "other", refused: "built as other"},
		{name: "dumped with the init, container without", dumped: true, refused: "does not run it"},
		{name: "dumped without, container with", running: true, refused: "does not run cklite's init"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &container{id: "c", withInit: tc.running, spec: &specs.Spec{}}
			if tc.running {
				c.spec.Mounts = []specs.Mount{{Destination: exechelper.InitPath, Source: self}}
			}
			err := sameInit(c, checkpoint.Meta{ID: "k", Init: tc.dumped, InitBuild: tc.dumpedBuild})
			if tc.refused == "" && err != nil {
				t.Fatalf("sameInit: %v, want accepted", err)
			}
			if tc.refused != "" && (!errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), tc.refused)) {
				t.Fatalf("sameInit: %v, want FailedPrecondition saying %q", err, tc.refused)
			}
		})
	}
	notELF := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := goBuildID(notELF); err == nil {
		t.Errorf("goBuildID of a script: no error")
	}
}
