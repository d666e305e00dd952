package podckpt

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestForkUIDs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		dirs  []string // below pod-forks/
		files []string // below pod-forks/
		want  []string
	}{
		{name: "no fork yet"},
		{name: "forks", dirs: []string{"a1", "b2/0"}, want: []string{"a1", "b2"}},
		{name: "files are no forks", dirs: []string{"a1"}, files: []string{"stray"}, want: []string{"a1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := t.TempDir()
			for _, d := range tc.dirs {
				if err := os.MkdirAll(filepath.Join(ns, forksDir, d), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(ns, forksDir, f), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ForkUIDs(ns)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("ForkUIDs: %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
