package runtime

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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

// TestWriteIfChanged: the configuration file is written when absent or different, and left
// alone (its modification time) when it holds the same options already.
func TestWriteIfChanged(t *testing.T) {
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		before      *string // the file's contents before; nil: absent
		data        string
		wantWritten bool
	}{
		{name: "absent", data: "leave-frozen\n", wantWritten: true},
		{name: "same", before: ptr("leave-frozen\n"), data: "leave-frozen\n"},
		{name: "changed", before: ptr("leave-frozen\n"), data: "leave-frozen\nnetwork-lock skip\n", wantWritten: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.conf")
			if tc.before != nil {
				if err := os.WriteFile(path, []byte(*tc.before), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Chtimes(path, old, old); err != nil {
					t.Fatal(err)
				}
			}
			if err := writeIfChanged(path, []byte(tc.data)); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != tc.data {
				t.Fatalf("contents %q, %v; want %q", got, err, tc.data)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if written := !fi.ModTime().Equal(old); written != tc.wantWritten {
				t.Fatalf("written: %t, want %t", written, tc.wantWritten)
			}
		})
	}
}
