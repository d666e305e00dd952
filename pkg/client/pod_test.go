package client

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestForkName(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    *runtimeapi.PodSandboxConfig
		logDir string // the fork's, before its suffix
	}{
		{"CRI only", &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "duo", Namespace: "default", Uid: "u1", Attempt: 2}}, ""},
		{"kubelet", &runtimeapi.PodSandboxConfig{
			Metadata:     &runtimeapi.PodSandboxMetadata{Name: "agent", Namespace: "team", Uid: "u2"},
			LogDirectory: "/var/log/pods/team_agent_u2/",
			Labels:       map[string]string{"io.kubernetes.pod.name": "agent", "io.kubernetes.pod.uid": "u2", "app": "x"},
			Annotations:  map[string]string{"io.kubernetes.pod.name": "agent"},
		}, "/var/log/pods/team_agent_u2-fork-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := tc.cfg.GetMetadata()
			name := forkName(tc.cfg)
			md := tc.cfg.GetMetadata()
			if !strings.HasPrefix(name, old.GetName()+"-fork-") || md.GetName() != name || md.GetNamespace() != old.GetNamespace() {
				t.Errorf("fork named %q, metadata %v", name, md)
			}
			if md.GetUid() == old.GetUid() || md.GetUid() == "" || md.GetAttempt() != 0 {
				t.Errorf("fork's uid %q, attempt %d", md.GetUid(), md.GetAttempt())
			}
			if tc.logDir == "" && tc.cfg.GetLogDirectory() != "" || !strings.HasPrefix(tc.cfg.GetLogDirectory(), tc.logDir) {
				t.Errorf("fork's log directory %q, want one starting %q", tc.cfg.GetLogDirectory(), tc.logDir)
			}
			if l := tc.cfg.GetLabels(); l != nil && (l["io.kubernetes.pod.name"] != name || l["io.kubernetes.pod.uid"] != md.GetUid() || l["app"] != "x") {
				t.Errorf("fork's labels %v", l)
			}
			if a := tc.cfg.GetAnnotations(); a != nil && (a["io.kubernetes.pod.name"] != name || len(a) != 1) {
				t.Errorf("fork's annotations %v", a)
			}
		})
	}
}

func TestPodVolumes(t *testing.T) {
	extra := t.TempDir()
	file := filepath.Join(extra, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	empty := "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache"
	st := podState{members: []podMember{
		{mounts: []*runtimeapi.Mount{{HostPath: empty + "/"}, {HostPath: "/var/lib/kubelet/pods/u1/etc-hosts"}}},
		{mounts: []*runtimeapi.Mount{{HostPath: empty}, {HostPath: "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~configmap/c"}}},
	}}
	for _, tc := range []struct {
		name  string
		extra []string
		want  []string
		fails bool
	}{
		{"emptyDirs once", nil, []string{empty}, false},
		{"and a host directory", []string{extra, extra + "/"}, []string{empty, extra}, false},
		{"not a directory", []string{file}, nil, true},
		{"missing", []string{filepath.Join(extra, "none")}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := st.volumes(tc.extra)
			if (err != nil) != tc.fails || !tc.fails && !slices.Equal(got, slices.Sorted(slices.Values(tc.want))) {
				t.Errorf("volumes(%v) = %v, %v; want %v", tc.extra, got, err, tc.want)
			}
		})
	}
}

func TestMatchPod(t *testing.T) {
	pods := []*runtimeapi.PodSandbox{
		{Id: "abc123", Metadata: &runtimeapi.PodSandboxMetadata{Name: "agent", Namespace: "default"}},
		{Id: "abd456", Metadata: &runtimeapi.PodSandboxMetadata{Name: "agent", Namespace: "team"}},
		{Id: "ff0001", Metadata: &runtimeapi.PodSandboxMetadata{Name: "web-x1", Namespace: "team"},
			Labels: map[string]string{"io.kubernetes.pod.name": "web", "io.kubernetes.pod.namespace": "team"}},
	}
	for _, tc := range []struct {
		ref, want string
		check     func(error) bool
	}{
		{"abc123", "abc123", nil},
		{"abd", "abd456", nil},
		{"team/agent", "abd456", nil},
		{"default/agent", "abc123", nil},
		{"web", "ff0001", nil},
		{"team/web", "ff0001", nil},
		{"web-x1", "ff0001", nil},
		{"agent", "", errdefs.IsInvalidArgument},
		{"ab", "", errdefs.IsInvalidArgument},
		{"nope", "", errdefs.IsNotFound},
		{"", "", errdefs.IsNotFound},
	} {
		got, err := matchPod(pods, tc.ref)
		switch {
		case tc.check != nil && !tc.check(err):
			t.Errorf("matchPod(%q): %v", tc.ref, err)
		case tc.check == nil && (err != nil || got.GetId() != tc.want):
			t.Errorf("matchPod(%q) = %s, %v; want %s", tc.ref, got.GetId(), err, tc.want)
		}
	}
}
