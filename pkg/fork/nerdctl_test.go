package fork

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
)

func TestStoreOf(t *testing.T) {
	for _, tc := range []struct {
		stateDir, id string
		want         nerdctlStore
		ok           bool
	}{
		{"/var/lib/nerdctl/1935db59/containers/default/0f1e", "0f1e", nerdctlStore{"/var/lib/nerdctl/1935db59", "default"}, true},
		{"", "0f1e", nerdctlStore{}, false},
		{"/var/lib/nerdctl/1935db59/containers/default/other", "0f1e", nerdctlStore{}, false},
		{"/somewhere/default/0f1e", "0f1e", nerdctlStore{}, false},
	} {
		got, ok := storeOf(containers.Container{ID: tc.id, Labels: map[string]string{nerdctlStateDir: tc.stateDir}})
		if got != tc.want || ok != tc.ok {
			t.Errorf("storeOf(%q) = %+v, %v; want %+v, %v", tc.stateDir, got, ok, tc.want, tc.ok)
		}
	}
}

func TestNameStore(t *testing.T) {
	s := nerdctlStore{dataStore: t.TempDir(), namespace: "default"}
	if err := s.acquire("web-fork-1", "aaa"); err != nil {
		t.Fatal(err)
	}
	if err := s.acquire("web-fork-1", "aaa"); err != nil {
		t.Fatalf("acquiring its own name again: %v", err)
	}
	if err := s.acquire("web-fork-1", "bbb"); !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "held by container aaa") {
		t.Fatalf("acquiring another's name: %v", err)
	}
	if err := s.release("web-fork-1", "bbb"); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(s.dataStore, "names", "default", "web-fork-1")); string(data) != "aaa" {
		t.Fatalf("after another's release the name is held by %q, want aaa", data)
	}
	if err := s.release("web-fork-1", "aaa"); err != nil {
		t.Fatal(err)
	}
	if err := s.acquire("web-fork-1", "bbb"); err != nil {
		t.Fatalf("a released name: %v", err)
	}
}

// TestOwnFiles: a fork of a nerdctl container gets copies of the /etc files in the original's
// directories, with its own hostname; other bind mounts stay.
func TestOwnFiles(t *testing.T) {
	store := &nerdctlStore{dataStore: t.TempDir(), namespace: "default"}
	write := func(path, data string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	orig := containers.Container{ID: "0f1e", Labels: map[string]string{nerdctlName: "web", nerdctlHostname: "0f1e"}}
	files := map[string]string{
		filepath.Join(store.stateDir("0f1e"), "resolv.conf"):     "nameserver 10.4.0.1\n",
		filepath.Join(store.stateDir("0f1e"), "hostname"):        "0f1e\n",
		filepath.Join(store.hostsDir("0f1e"), "hosts"):           "127.0.0.1\tlocalhost\n10.4.0.7\t0f1e web\n",
		filepath.Join(store.stateDir("0f1e"), "log-config.json"): `{"driver":"json-file","opts":{"log-path":"/var/log/web.log","max-size":"1m"}}`,
	}
	for p, d := range files {
		write(p, d)
	}
	spec := &specs.Spec{Hostname: "0f1e", Mounts: []specs.Mount{
		{Destination: "/etc/resolv.conf", Source: filepath.Join(store.stateDir("0f1e"), "resolv.conf")},
		{Destination: "/etc/hostname", Source: filepath.Join(store.stateDir("0f1e"), "hostname")},
		{Destination: "/etc/hosts", Source: filepath.Join(store.hostsDir("0f1e"), "hosts")},
		{Destination: "/data", Source: "/srv/data"},
	}}
	f := identity{id: "f1f1", name: "web-fork-1", hostname: "f1f1", store: store}
	moved, err := f.ownFiles(orig, spec)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		filepath.Join(store.stateDir("f1f1"), "resolv.conf"):     "nameserver 10.4.0.1\n",
		filepath.Join(store.stateDir("f1f1"), "hostname"):        "f1f1\n",
		filepath.Join(store.hostsDir("f1f1"), "hosts"):           "127.0.0.1\tlocalhost\n10.4.0.7\tf1f1\tweb-fork-1\n",
		filepath.Join(store.stateDir("f1f1"), "log-config.json"): `{"driver":"json-file","opts":{"max-size":"1m"}}`,
		// The json-file driver's file, which nerdctl logs reads, as nerdctl run makes it.
		filepath.Join(store.stateDir("f1f1"), "f1f1-json.log"): "",
	}
	for p, d := range want {
		if got, err := os.ReadFile(p); err != nil || string(got) != d {
			t.Errorf("%s holds %q (%v), want %q", p, got, err, d)
		}
	}
	if len(moved) != 3 || moved[spec.Mounts[2].Source] != filepath.Join(store.hostsDir("f1f1"), "hosts") {
		t.Errorf("moved %v, want the three /etc files", moved)
	}
	for p, d := range files {
		if got, _ := os.ReadFile(p); string(got) != d {
			t.Errorf("the original's %s changed to %q", p, got)
		}
	}
	if err := f.removeFiles(); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{store.stateDir("f1f1"), store.hostsDir("f1f1")} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s after removeFiles: %v", dir, err)
		}
	}
}
