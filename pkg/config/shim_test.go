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
		noDedup bool
		init    bool
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
		{name: "dedup off", file: `dedup_memory = false`, noDedup: true},
		{name: "dedup on", file: `dedup_memory = true`},
		{name: "init on", file: `init = true`, init: true},
		{name: "init off", file: `init = false`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := loadShimFile(t, tc.file, tc.wantErr)
			if !ok {
				return
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
			if c.DedupMemoryOn() == tc.noDedup {
				t.Fatalf("DedupMemoryOn = %v, want %v", c.DedupMemoryOn(), !tc.noDedup)
			}
			if c.InitOn() != tc.init {
				t.Fatalf("InitOn = %v, want %v", c.InitOn(), tc.init)
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

func TestRestoreLimits(t *testing.T) {
	for _, tc := range []struct {
		name        string
		file        string
		wantTimeout time.Duration
		wantLog     int64
		wantErr     string
	}{
		{name: "defaults", file: "\n", wantTimeout: time.Minute, wantLog: 64 << 20},
		{name: "set", file: "restore_timeout = \"5s\"\nrestore_log_limit_mib = 0.5", wantTimeout: 5 * time.Second, wantLog: 512 << 10},
		{name: "no limits", file: "restore_timeout = \"0s\"\nrestore_log_limit_mib = 0"},
		{name: "bad timeout", file: `restore_timeout = "a while"`, wantErr: "restore_timeout"},
		{name: "negative timeout", file: `restore_timeout = "-1s"`, wantErr: "restore_timeout"},
		{name: "negative log limit", file: `restore_log_limit_mib = -1`, wantErr: "restore_log_limit_mib"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := loadShimFile(t, tc.file, tc.wantErr)
			if !ok {
				return
			}
			timeout, logBytes, err := c.RestoreLimits()
			if err != nil || timeout != tc.wantTimeout || logBytes != tc.wantLog {
				t.Fatalf("RestoreLimits = %v, %d, %v; want %v, %d", timeout, logBytes, err, tc.wantTimeout, tc.wantLog)
			}
		})
	}
}

// loadShimFile loads file ("": none) as the shim's configuration and checks the error against
// wantErr; it reports whether there is a configuration to look at.
func loadShimFile(t *testing.T, file, wantErr string) (Shim, bool) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "shim.toml")
	if file != "" {
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(ShimConfigEnv, path)
	c, err := LoadShim()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("LoadShim = %+v, %v; want an error naming %q", c, err, wantErr)
		}
		return c, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return c, true
}
