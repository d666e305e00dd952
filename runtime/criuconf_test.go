package runtime

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/utils"
)

func TestWithCRIUOptions(t *testing.T) {
	own := filepath.Join(t.TempDir(), "own.conf")
	if err := os.WriteFile(own, []byte("tcp-close"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name         string
		labels       []string
		wantContains []string
		wantOriginal string
	}{
		{name: "no annotation", labels: []string{"bundle=/b"}, wantContains: []string{LeaveStopped}, wantOriginal: "default"},
		{name: "the spec's file", labels: []string{"bundle=/b", criuConfigLabel + "=" + own}, wantContains: []string{"tcp-close", LeaveStopped}, wantOriginal: "named:" + own},
		{name: "CRIU configuration off", labels: []string{criuConfigLabel + "="}, wantContains: []string{LeaveStopped}, wantOriginal: "named:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &configs.Config{Labels: slices.Clone(tc.labels)}
			dir := t.TempDir()
			if err := WithCRIUOptions(cfg, dir, LeaveStopped); err != nil {
				t.Fatal(err)
			}
			// Twice, as a second dump or restore would: the original is kept, not ours.
			if err := WithCRIUOptions(cfg, dir, LeaveStopped); err != nil {
				t.Fatal(err)
			}
			conf, _ := utils.SearchLabels(cfg.Labels, criuConfigLabel)
			data, err := os.ReadFile(conf)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range tc.wantContains {
				if !strings.Contains(string(data), want) {
					t.Errorf("configuration %q lacks %q", data, want)
				}
			}
			if strings.Count(string(data), LeaveStopped) != 1 {
				t.Errorf("configuration %q has the option more than once", data)
			}
			if _, original := ownCRIUConfig(cfg.Labels); original != tc.wantOriginal {
				t.Errorf("original configuration %q, want %q", original, tc.wantOriginal)
			}
			// The next dump without options gets the container's own configuration back.
			if !resetCRIUOptions(cfg) || !slices.Equal(slices.Sorted(slices.Values(cfg.Labels)), slices.Sorted(slices.Values(tc.labels))) {
				t.Errorf("labels after the reset %q, want %q", cfg.Labels, tc.labels)
			}
			if resetCRIUOptions(cfg) {
				t.Errorf("a second reset found options to remove: %q", cfg.Labels)
			}
		})
	}
}
