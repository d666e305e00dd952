package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadSnapshotter(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name    string
		path    string
		want    Snapshotter
		wantErr string
	}{
		{
			name: "overrides",
			path: write("ok.toml", "root = \"/srv/ck\"\ndedup = true\nmerge_fan_out = 8\n"),
			want: Snapshotter{Address: DefaultSnapshotterAddress, Root: "/srv/ck", ContainerdAddress: DefaultContainerdAddress, LogLevel: "info", Dedup: true, MergeFanOut: 8},
		},
		{name: "unknown key", path: write("typo.toml", "rooot = \"/x\"\n"), wantErr: "rooot"},
		{name: "bad syntax", path: write("bad.toml", "root = \n"), wantErr: "bad.toml"},
		{name: "missing file", path: filepath.Join(dir, "none.toml"), wantErr: "none.toml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadSnapshotter(tc.path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
