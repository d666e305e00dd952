package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ckliteHandler is the header of the cklite CRI runtime handler's table in `containerd config dump`.
const ckliteHandler = "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.cklite"

// TestContribKubernetesConfig checks that the snippets a node operator imports
// (contrib/containerd/cklite.toml, contrib/kubernetes/containerd-cri.toml) give containerd the
// same cklite runtime handler as the configuration the CRI tests run with, so the documented setup
// is the tested one.
func TestContribKubernetesConfig(t *testing.T) {
	s := loadStack(t)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	d := &Daemon{stack: s, Dir: dir, Root: filepath.Join(dir, "root"), State: filepath.Join(dir, "state"),
		Address: filepath.Join(dir, "c.sock"), HostsDir: filepath.Join(dir, "certs.d"),
		SnapshotterAddress: filepath.Join(dir, "cklite-snapshotter.sock")}
	node := `version = 3
imports = [` + "'" + filepath.Join(root, "contrib/containerd/cklite.toml") + "', '" + filepath.Join(root, "contrib/kubernetes/containerd-cri.toml") + `']
`
	tested := dumpConfig(t, s, dir, "tested.toml", d.containerdConfig())
	documented := dumpConfig(t, s, dir, "node.toml", node)
	if got, want := section(documented, ckliteHandler), section(tested, ckliteHandler); got == "" || got != want {
		t.Errorf("the contrib snippets' cklite handler:\n%s\nthe tested one:\n%s", got, want)
	}
	for _, want := range []string{"enable_criu = true", "default = ['cklite-diff', 'walking']", "[proxy_plugins.cklite]"} {
		if !strings.Contains(documented, want) {
			t.Errorf("the contrib snippets lack %q", want)
		}
	}
}

// dumpConfig writes config as dir/name and returns containerd's view of it.
func dumpConfig(t *testing.T, s *Stack, dir, name, config string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(s.Bin, "containerd"), "--config", path, "config", "dump").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd rejects %s: %v\n%s", name, err, out)
	}
	return string(out)
}

// section returns the lines of the table whose header starts with prefix, with its sub-tables.
func section(dump, prefix string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(dump, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "[") {
			in = strings.HasPrefix(trimmed, prefix)
		}
		if in {
			b.WriteString(trimmed + "\n")
		}
	}
	return b.String()
}
