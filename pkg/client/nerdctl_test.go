package client

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cklite/cklite/pkg/checkpoint"
)

func TestNerdctlImages(t *testing.T) {
	root := t.TempDir()
	toml := filepath.Join(root, "nerdctl.toml")
	if err := os.WriteFile(toml, []byte("data_root = \""+root+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NERDCTL_TOML", toml)
	checkpoints := filepath.Join(root, "checkpoints")
	for name, id := range map[string]string{"ck1": "aaaaaaaaaaaa", "ck2": "bbbbbbbbbbbb", "runc": ""} {
		dir := filepath.Join(checkpoints, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if id != "" {
			if err := checkpoint.Write(dir, checkpoint.Meta{ID: id, Contents: checkpoint.MemoryOnly}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got, err := NerdctlCheckpoints(); err != nil || got != checkpoints {
		t.Fatalf("NerdctlCheckpoints() = %q, %v; want %s", got, err, checkpoints)
	}
	for _, tc := range []struct {
		name, id, ref, want string
	}{
		{"by nerdctl's name", "", "ck2", "ck2"},
		{"by the checkpoint's id", "aaaaaaaaaaaa", "", "ck1"},
		{"a stock runc checkpoint is none", "", "runc", ""},
		{"no such name", "", "ck3", ""},
		{"no path in a name", "", "../checkpoints/ck1", ""},
		{"unknown id", "cccccccccccc", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := ""
			if tc.want != "" {
				want = filepath.Join(checkpoints, tc.want)
			}
			if got := nerdctlImages(tc.id, tc.ref); got != want {
				t.Fatalf("nerdctlImages(%q, %q) = %q, want %q", tc.id, tc.ref, got, want)
			}
		})
	}
	t.Setenv("NERDCTL_TOML", filepath.Join(root, "none.toml"))
	if got, err := NerdctlCheckpoints(); err != nil || got != "/var/lib/nerdctl/checkpoints" {
		t.Fatalf("without a nerdctl.toml: %q, %v; want nerdctl's default", got, err)
	}
}
