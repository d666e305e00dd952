package client

import (
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/errdefs"
)

func TestPickContainer(t *testing.T) {
	named := func(id, name string) containers.Container {
		c := containers.Container{ID: id}
		if name != "" {
			c.Labels = map[string]string{NerdctlNameLabel: name}
		}
		return c
	}
	all := []containers.Container{
		named("4f2a9c0000", "agent"),
		named("4f2b110000", "web"),
		named("agentx", ""),    // an id that begins with another container's name
		named("c0ffee", "dup"), // two containers of one name (nerdctl refuses it, ctr does not check)
		named("c0ffef", "dup"),
		named("web", "other"), // an id that is another container's name: the id wins
	}
	for _, tc := range []struct {
		ref   string
		want  string
		isErr func(error) bool
		says  string
	}{
		{ref: "4f2a9c0000", want: "4f2a9c0000"},
		{ref: "agent", want: "4f2a9c0000"}, // the name wins over the id prefix of agentx
		{ref: "4f2a", want: "4f2a9c0000"},
		{ref: "web", want: "web"},
		{ref: "agentx", want: "agentx"},
		{ref: "4f2", isErr: errdefs.IsInvalidArgument, says: `container id prefix "4f2" is ambiguous in namespace ns: it matches 4f2a9c0000 (agent), 4f2b110000 (web)`},
		{ref: "dup", isErr: errdefs.IsInvalidArgument, says: "c0ffee (dup), c0ffef (dup)"},
		{ref: "nope", isErr: errdefs.IsNotFound, says: `no container "nope" in namespace ns`},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			got, err := pickContainer(all, "ns", tc.ref)
			if tc.isErr != nil {
				if err == nil || !tc.isErr(err) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("pickContainer(%q) = %q, %v; want an error saying %q", tc.ref, got, err, tc.says)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("pickContainer(%q) = %q, %v; want %s", tc.ref, got, err, tc.want)
			}
		})
	}
}
