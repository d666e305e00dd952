package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cklite/cklite/pkg/paths"
)

func TestLoadShim(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    string // "" : no file at the named path
		wantTTL time.Duration
		wantDir string // "": the default
		wantErr string
	}{
		{name: "ttl", file: `checkpoint_ttl = "36h"`, wantTTL: 36 * time.Hour},
		{name: "empty", file: "\n"},
		{name: "bad ttl", file: `checkpoint_ttl = "soon"`, wantErr: "checkpoint_ttl"},
		{name: "negative ttl", file: `checkpoint_ttl = "-1h"`, wantErr: "positive"},
		{name: "unknown key", file: `ttl = "1h"`, wantErr: "ttl"},
		{name: "state dir", file: `state_dir = "/srv/cklite"`, wantDir: "/srv/cklite"},
		{name: "relative state dir", file: `state_dir = "cklite"`, wantErr: "absolute"},
		{name: "named file missing", wantErr: "reading configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "shim.toml")
			if tc.file != "" {
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			t.Setenv(ShimConfigEnv, path)
			c, err := LoadShim()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("LoadShim = %+v, %v; want an error naming %q", c, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ttl, _ := c.DefaultTTL(); ttl != tc.wantTTL {
				t.Fatalf("DefaultTTL = %v, want %v", ttl, tc.wantTTL)
			}
			if tc.wantDir == "" {
				tc.wantDir = paths.DefaultStateDir
			}
			if c.StateDir != tc.wantDir {
				t.Fatalf("StateDir = %q, want %q", c.StateDir, tc.wantDir)
			}
		})
	}
}

// TestContribConfigs loads the example configurations shipped in contrib/: they must stay valid.
func TestContribConfigs(t *testing.T) {
	t.Setenv(ShimConfigEnv, filepath.Join("..", "..", "contrib", "shim.toml"))
	if _, err := LoadShim(); err != nil {
		t.Errorf("contrib/shim.toml: %v", err)
	}
	if _, err := LoadSnapshotter(filepath.Join("..", "..", "contrib", "snapshotter.toml")); err != nil {
		t.Errorf("contrib/snapshotter.toml: %v", err)
	}
}
