package fork

import (
	"encoding/json"
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// nerdctlSpec is the part of a spec nerdctl run writes that a fork changes or must keep.
func nerdctlSpec() *oci.Spec {
	return &oci.Spec{
		Hostname: "web",
		Hooks: &specs.Hooks{
			CreateRuntime: []specs.Hook{{Path: "/usr/local/bin/nerdctl", Args: []string{"nerdctl", "internal", "oci-hook", "createRuntime"}}},
			Poststop:      []specs.Hook{{Path: "/usr/local/bin/nerdctl", Args: []string{"nerdctl", "internal", "oci-hook", "postStop"}}},
		},
		Annotations: map[string]string{"nerdctl/name": "web"},
		Linux: &specs.Linux{
			CgroupsPath: "/default/0f1e2d",
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1234"},
				{Type: specs.IPCNamespace, Path: "/proc/42/ns/ipc"},
			},
		},
	}
}

func TestSpecFor(t *testing.T) {
	for _, tc := range []struct {
		name     string
		edit     func(*oci.Spec) // of the original
		want     func(*oci.Spec) // of the fork, from the original after edit
		network  bool
		hostname string
		moved    map[string]string
	}{
		{
			name:    "network: nerdctl's hooks stay",
			network: true,
			want: func(s *oci.Spec) {
				s.Linux.CgroupsPath = "/default/web-fork-1"
				s.Linux.Namespaces[1].Path = ""
			},
		},
		{
			name:     "own /etc files and hostname",
			hostname: "0a1b2c3d4e5f",
			moved:    map[string]string{"/nd/containers/default/0f1e2d/resolv.conf": "/nd/containers/default/web-fork-1/resolv.conf"},
			edit: func(s *oci.Spec) {
				s.Mounts = []specs.Mount{
					{Destination: "/etc/resolv.conf", Source: "/nd/containers/default/0f1e2d/resolv.conf", Type: "bind"},
					{Destination: "/data", Source: "/srv/data", Type: "bind"},
				}
			},
			want: func(s *oci.Spec) {
				s.Hooks = nil
				s.Hostname = "0a1b2c3d4e5f"
				s.Mounts[0].Source = "/nd/containers/default/web-fork-1/resolv.conf"
				s.Linux.CgroupsPath = "/default/web-fork-1"
				s.Linux.Namespaces[1].Path = ""
			},
		},
		{
			name: "nerdctl container: own cgroup and netns, no hooks, the rest kept",
			want: func(s *oci.Spec) {
				s.Hooks = nil
				s.Linux.CgroupsPath = "/default/web-fork-1"
				s.Linux.Namespaces[1].Path = ""
			},
		},
		{
			name: "systemd cgroup",
			edit: func(s *oci.Spec) { s.Linux.CgroupsPath = "system.slice:nerdctl:0f1e2d" },
			want: func(s *oci.Spec) {
				s.Hooks = nil
				s.Linux.CgroupsPath = "system.slice:nerdctl:web-fork-1"
				s.Linux.Namespaces[1].Path = ""
			},
		},
		{
			name: "relative cgroupfs path",
			edit: func(s *oci.Spec) { s.Linux.CgroupsPath = "0f1e2d" },
			want: func(s *oci.Spec) {
				s.Hooks = nil
				s.Linux.CgroupsPath = "web-fork-1"
				s.Linux.Namespaces[1].Path = ""
			},
		},
		{
			name: "no cgroups path: the runtime derives one from the id",
			edit: func(s *oci.Spec) { s.Linux.CgroupsPath = "" },
			want: func(s *oci.Spec) {
				s.Hooks = nil
				s.Linux.Namespaces[1].Path = ""
			},
		},
		{
			name: "host network: no namespace to clear",
			edit: func(s *oci.Spec) { s.Linux.Namespaces = s.Linux.Namespaces[:1] },
			want: func(s *oci.Spec) {
				s.Hooks = nil
				s.Linux.CgroupsPath = "/default/web-fork-1"
			},
		},
		{
			name: "no linux section",
			edit: func(s *oci.Spec) { s.Linux = nil },
			want: func(s *oci.Spec) { s.Hooks = nil },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			original := nerdctlSpec()
			if tc.edit != nil {
				tc.edit(original)
			}
			data, err := json.Marshal(original)
			if err != nil {
				t.Fatal(err)
			}
			f := identity{id: "web-fork-1", hostname: tc.hostname}
			got, err := specFor(data, f, tc.moved, map[string]string{"nerdctl/name": "web-fork-1"}, tc.network)
			if err != nil {
				t.Fatal(err)
			}
			want := nerdctlSpec()
			if tc.edit != nil {
				tc.edit(want)
			}
			tc.want(want)
			if want.Annotations != nil {
				want.Annotations["nerdctl/name"] = "web-fork-1"
			}
			if !reflect.DeepEqual(got, want) {
				g, _ := json.MarshalIndent(got, "", " ")
				w, _ := json.MarshalIndent(want, "", " ")
				t.Fatalf("fork spec:\n%s\nwant:\n%s", g, w)
			}
		})
	}
	if _, err := specFor([]byte("{"), identity{id: "x"}, nil, nil, false); err == nil {
		t.Fatal("a spec that does not decode gave no error")
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		n      int
		want   []string
		says   string // of the error, when one is wanted
	}{
		{prefix: "web-fork", n: 3, want: []string{"web-fork-1", "web-fork-2", "web-fork-3"}},
		{prefix: "a", n: 1, want: []string{"a-1"}},
		{prefix: "web-fork", n: 0, says: "at least one"},
		{prefix: "has/slash", n: 1, says: `prefix "has/slash"`},
		{prefix: "", n: 1, says: `prefix ""`},
		{prefix: strings.Repeat("x", 74), n: 10, says: "fork name"}, // the 10th is 77 characters, containerd takes 76
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			got, err := Names(tc.prefix, tc.n)
			if tc.says != "" {
				if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("Names(%q, %d) = %v, %v; want an invalid-argument error saying %q", tc.prefix, tc.n, got, err, tc.says)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Names(%q, %d) = %v, %v; want %v", tc.prefix, tc.n, got, err, tc.want)
			}
		})
	}
}

func TestDefaultPrefix(t *testing.T) {
	for _, tc := range []struct {
		container containers.Container
		want      string
	}{
		{containers.Container{ID: "web"}, "web-fork"},
		{containers.Container{ID: "1240cba03431", Labels: map[string]string{"nerdctl/name": "web"}}, "web-fork"},
		{containers.Container{ID: "1240cba03431", Labels: map[string]string{"nerdctl/name": ""}}, "1240cba03431-fork"},
	} {
		if got := DefaultPrefix(tc.container); got != tc.want {
			t.Errorf("DefaultPrefix(%+v) = %q, want %q", tc.container, got, tc.want)
		}
	}
}

func TestLabelsFor(t *testing.T) {
	original := map[string]string{
		"nerdctl/name":                           "web",
		"nerdctl/hostname":                       "web",
		"nerdctl/state-dir":                      "/nd/containers/default/0f1e2d",
		"nerdctl/anonymous-volumes":              `["abc"]`,
		"nerdctl/ip":                             "10.4.0.7",
		"nerdctl/networks":                       `["bridge"]`,
		"nerdctl/log-uri":                        "binary:///usr/local/bin/nerdctl?_NERDCTL_INTERNAL_LOGGING=/nd",
		"com.docker.compose.service":             "web",
		"cklite.io/lineage":                      "0123456789ab",
		"io.containerd.image.config.stop-signal": "SIGTERM",
		"app":                                    "agent",
		"nerdctl-like/kept":                      "yes",
	}
	common := map[string]string{
		"io.containerd.image.config.stop-signal": "SIGTERM",
		"app":                                    "agent",
		"nerdctl-like/kept":                      "yes",
		"nerdctl/name":                           "web-fork-1",
		"nerdctl/namespace":                      "default",
	}
	store := &nerdctlStore{dataStore: "/nd", namespace: "default"}
	for _, tc := range []struct {
		name    string
		f       identity
		network bool
		want    map[string]string
	}{
		{"not nerdctl's: a name only", identity{id: "f1", name: "web-fork-1"}, false, common},
		{"nerdctl's: own state, no network", identity{id: "f1", name: "web-fork-1", hostname: "f1", store: store}, false, with(common, map[string]string{
			"nerdctl/state-dir": "/nd/containers/default/f1", "nerdctl/hostname": "f1", "nerdctl/networks": `["none"]`,
			"nerdctl/log-uri": original["nerdctl/log-uri"],
		})},
		{"nerdctl's, network: the original's networks, not its address", identity{id: "f1", name: "web-fork-1", hostname: "f1", store: store}, true, with(common, map[string]string{
			"nerdctl/state-dir": "/nd/containers/default/f1", "nerdctl/hostname": "f1", "nerdctl/networks": `["bridge"]`,
			"nerdctl/log-uri": original["nerdctl/log-uri"],
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := maps.Clone(original)
			if got := labelsFor(original, tc.f, "default", tc.network); !maps.Equal(got, tc.want) {
				t.Fatalf("fork labels %v, want %v", got, tc.want)
			}
			if !maps.Equal(original, before) {
				t.Fatalf("the original's labels changed: %v", original)
			}
		})
	}
}

func with(a, b map[string]string) map[string]string {
	m := maps.Clone(a)
	maps.Copy(m, b)
	return m
}
