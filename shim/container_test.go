package shim

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestPrivatePidNS(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec *specs.Spec
		want bool
	}{
		{"no linux section", &specs.Spec{}, false},
		{"no pid namespace", &specs.Spec{Linux: &specs.Linux{}}, false},
		{"new pid namespace", &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}}}}, true},
		{"joined pid namespace", &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace, Path: "/proc/1/ns/pid"}}}}, false},
	} {
		if got := privatePidNS(tc.spec); got != tc.want {
			t.Errorf("%s: got %v", tc.name, got)
		}
	}
}
