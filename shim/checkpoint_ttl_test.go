package shim

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/config"
)

func TestCheckpointTTL(t *testing.T) {
	dir := t.TempDir()
	conf, empty := filepath.Join(dir, "shim.toml"), filepath.Join(dir, "empty.toml")
	for f, text := range map[string]string{conf: `checkpoint_ttl = "24h"`, empty: ""} {
		if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name        string
		config      string
		annotations map[string]string
		labels      map[string]string
		want        time.Duration
		wantErr     bool
	}{
		{name: "none", config: empty},
		{name: "named configuration missing", config: filepath.Join(dir, "absent.toml"), wantErr: true},
		{name: "configured default", config: conf, want: 24 * time.Hour},
		{name: "annotation over the default", config: conf, annotations: map[string]string{checkpoint.TTLKey: "1h"}, want: time.Hour},
		{name: "label over annotation", config: conf, annotations: map[string]string{checkpoint.TTLKey: "1h"}, labels: map[string]string{checkpoint.TTLKey: "2m"}, want: 2 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(config.ShimConfigEnv, tc.config)
			got, err := checkpointTTL(loadShimConfig(context.Background()), tc.annotations, tc.labels)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("checkpointTTL = %v, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("checkpointTTL = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
