package setup

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	srvconfig "github.com/containerd/containerd/v2/cmd/containerd/server/config"
	"github.com/pelletier/go-toml/v2"

	"github.com/cklite/cklite/pkg/config"
)

// nerdctlTOML is the part of nerdctl's configuration (pkg/config of nerdctl v2.2) that setup
// writes; decoding strictly into it catches a misspelt key.
type nerdctlTOML struct {
	Address        string `toml:"address"`
	Snapshotter    string `toml:"snapshotter"`
	CgroupManager  string `toml:"cgroup_manager"`
	DataRoot       string `toml:"data_root"`
	CNIPath        string `toml:"cni_path"`
	CNINetConfPath string `toml:"cni_netconfpath"`
}

// writeRendered renders o and writes its files, as cklite setup does.
func writeRendered(t *testing.T, o Options) Layout {
	t.Helper()
	files, err := Render(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Write(o.Root, files, false); err != nil {
		t.Fatal(err)
	}
	return Layout{o.Root}
}

// The private instance's files load as each program loads them, and agree on every address.
func TestRenderPrivate(t *testing.T) {
	root := t.TempDir()
	l := writeRendered(t, Options{Root: root, CNIBin: "/opt/cklite/cni/bin", Platform: "linux/amd64", Subnet: "10.224.7.0/24"})

	// containerd's own loader, imports included.
	var c srvconfig.Config
	if err := srvconfig.LoadConfig(context.Background(), l.ContainerdConfig(), &c); err != nil {
		t.Fatal(err)
	}
	if c.Version != 3 || c.Root != l.ContainerdRoot() || c.State != l.ContainerdState() || c.GRPC.Address != l.ContainerdAddress() || c.TTRPC.Address != l.ContainerdAddress()+".ttrpc" {
		t.Errorf("containerd config: version %d root %s state %s grpc %s ttrpc %s", c.Version, c.Root, c.State, c.GRPC.Address, c.TTRPC.Address)
	}
	for _, name := range []string{Snapshotter, Differ} {
		if p := c.ProxyPlugins[name]; p.Address != l.SnapshotterAddress() {
			t.Errorf("proxy plugin %s: %+v, want address %s", name, p, l.SnapshotterAddress())
		}
	}
	// The snippet's CRI handler merges with the main file's CRI settings, neither replaces the other.
	cri := lookup(t, c.Plugins, "io.containerd.cri.v1.runtime")
	if got := lookup(t, cri, "containerd", "runtimes", "cklite", "runtime_type"); got != Runtime {
		t.Errorf("CRI handler cklite: runtime_type %v", got)
	}
	if got := lookup(t, cri, "cni", "conf_dir"); got != l.CNIConfDir() {
		t.Errorf("CRI cni conf_dir %v, want %s", got, l.CNIConfDir())
	}
	if got := lookup(t, c.Plugins, "io.containerd.service.v1.diff-service", "default"); !strings.HasPrefix(strings.Join(toStrings(got), ","), Differ+",") {
		t.Errorf("diff order %v: want %s first", got, Differ)
	}

	snap, err := config.LoadSnapshotter(l.SnapshotterConfig())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Address != l.SnapshotterAddress() || snap.Root != l.SnapshotterRoot() || snap.ContainerdAddress != l.ContainerdAddress() {
		t.Errorf("snapshotter config %+v", snap)
	}

	t.Setenv(config.ShimConfigEnv, l.ShimConfig())
	shim, err := config.LoadShim()
	if err != nil || shim.StateDir != l.StateDir() {
		t.Errorf("shim config: %+v, %v; want state_dir %s", shim, err, l.StateDir())
	}

	n := decodeNerdctl(t, l)
	want := nerdctlTOML{Address: l.ContainerdAddress(), Snapshotter: Snapshotter, CgroupManager: "cgroupfs", DataRoot: l.NerdctlDataRoot(), CNIPath: "/opt/cklite/cni/bin", CNINetConfPath: l.CNIConfDir()}
	if n != want {
		t.Errorf("nerdctl.toml %+v, want %+v", n, want)
	}

	env := readEnv(t, l)
	for k, v := range map[string]string{"CONTAINERD_ADDRESS": l.ContainerdAddress(), "NERDCTL_TOML": l.NerdctlConfig(), config.ShimConfigEnv: l.ShimConfig(), "CKLITE_ROOT": root} {
		if env[k] != v {
			t.Errorf("env %s=%q, want %q", k, env[k], v)
		}
	}
}

// For a containerd that runs already: no configuration of its own, everything points at it.
func TestRenderExisting(t *testing.T) {
	root := t.TempDir()
	const address = "/run/other/containerd.sock"
	l := writeRendered(t, Options{Root: root, Existing: true, Address: "unix://" + address, CNIBin: "/opt/cni/bin"})
	for _, p := range []string{l.ContainerdConfig(), l.ShimConfig()} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s written for an existing containerd (%v)", p, err)
		}
	}
	// The snippet alone, as containerd loads an import.
	var c srvconfig.Config
	if err := srvconfig.LoadConfig(context.Background(), l.CkliteSnippet(), &c); err != nil {
		t.Fatal(err)
	}
	if c.ProxyPlugins[Snapshotter].Address != l.SnapshotterAddress() {
		t.Errorf("snippet: proxy plugin %+v", c.ProxyPlugins[Snapshotter])
	}
	snap, err := config.LoadSnapshotter(l.SnapshotterConfig())
	if err != nil || snap.ContainerdAddress != address {
		t.Errorf("snapshotter config %+v, %v; want containerd_address %s", snap, err, address)
	}
	if n := decodeNerdctl(t, l); n.Address != address || n.DataRoot != "" {
		t.Errorf("nerdctl.toml %+v: want the existing address and nerdctl's own data root", n)
	}
	if env := readEnv(t, l); env["CONTAINERD_ADDRESS"] != address || env[config.ShimConfigEnv] != "" {
		t.Errorf("env %v", env)
	}
}

func TestRenderRefuses(t *testing.T) {
	long := "/" + strings.Repeat("x", 100)
	const net = "10.224.7.0/24"
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"relative root", Options{Root: "cklite", CNIBin: "/c", Subnet: net}, "absolute"},
		{"relative address", Options{Root: "/r", Address: "ctrd.sock", CNIBin: "/c", Subnet: net}, "absolute"},
		{"socket too long", Options{Root: long, CNIBin: "/c", Subnet: net}, "unix socket"},
		{"quote", Options{Root: "/r'x", CNIBin: "/c", Subnet: net}, "quotes"},
		{"newline", Options{Root: "/r\nx", CNIBin: "/c", Subnet: net}, "unprintable"},
		{"no CNI", Options{Root: "/r", Subnet: net}, "CNI"},
		{"no subnet", Options{Root: "/r", CNIBin: "/c"}, "subnet"},
		{"not a subnet", Options{Root: "/r", CNIBin: "/c", Subnet: "10.224.7.1/24"}, "subnet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Render(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Render(%+v) = %v, want an error naming %q", tc.o, err, tc.want)
			}
		})
	}
}

func TestWriteIdempotent(t *testing.T) {
	root := t.TempDir()
	o := Options{Root: root, CNIBin: "/opt/cni/bin", Subnet: "10.224.7.0/24"}
	files, err := Render(o)
	if err != nil {
		t.Fatal(err)
	}
	first, err := Write(root, files, false)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Write(root, files, false)
	if err != nil {
		t.Fatal(err)
	}
	for i := range files {
		if !first[i].Changed || again[i].Changed {
			t.Errorf("%s: changed %v, then %v; want written once", files[i].Path, first[i].Changed, again[i].Changed)
		}
	}

	// A file changed by hand is kept, and nothing else is written either.
	l := Layout{root}
	if err := os.WriteFile(l.NerdctlConfig(), []byte("# mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	other, err := Render(Options{Root: root, CNIBin: "/elsewhere", Subnet: "10.224.7.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Write(root, other, false); err == nil || !strings.Contains(err.Error(), l.NerdctlConfig()) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("Write over an edited file: %v, want a refusal naming it", err)
	}
	if b, _ := os.ReadFile(l.NerdctlConfig()); string(b) != "# mine\n" {
		t.Fatalf("the edited file was replaced: %q", b)
	}
	if b, _ := os.ReadFile(l.ContainerdConfig()); bytes.Contains(b, []byte("/elsewhere")) {
		t.Fatal("a refused write wrote another file")
	}
	if _, err := Write(root, other, true); err != nil {
		t.Fatal(err)
	}
	if n := decodeNerdctl(t, l); n.CNIPath != "/elsewhere" {
		t.Fatalf("--force did not replace nerdctl.toml: %+v", n)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(root, "etc", ".*")); len(leftovers) > 0 {
		t.Fatalf("temporary files left: %v", leftovers)
	}
}

func decodeNerdctl(t *testing.T, l Layout) nerdctlTOML {
	t.Helper()
	b, err := os.ReadFile(l.NerdctlConfig())
	if err != nil {
		t.Fatal(err)
	}
	var n nerdctlTOML
	d := toml.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&n); err != nil {
		t.Fatalf("nerdctl.toml: %v", err)
	}
	return n
}

// readEnv reads the env file's exports (KEY='value').
func readEnv(t *testing.T, l Layout) map[string]string {
	t.Helper()
	b, err := os.ReadFile(l.Env())
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if kv, ok := strings.CutPrefix(line, "export "); ok {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = strings.Trim(v, "'")
		}
	}
	return env
}

// lookup walks nested TOML tables by key.
func lookup(t *testing.T, m any, keys ...string) any {
	t.Helper()
	for _, k := range keys {
		table, ok := m.(map[string]any)
		if !ok {
			t.Fatalf("%s: not a table (%T)", k, m)
		}
		if m, ok = table[k]; !ok {
			t.Fatalf("no key %s (have %v)", k, keysOf(table))
		}
	}
	return m
}

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func toStrings(v any) []string {
	var out []string
	if list, ok := v.([]any); ok {
		for _, e := range list {
			out = append(out, e.(string))
		}
	}
	return out
}
