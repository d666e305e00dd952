package capture

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyXattrs: a capture keeps an entry's extended attributes but overlayfs's opaque mark
// (set apart) and its upper-only bookkeeping, which a lower layer does without.
func TestCopyXattrs(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("trusted.* attributes need root")
	}
	for _, tc := range []struct {
		name string
		dir  bool
	}{{"directory", true}, {"file", false}} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			src, dst := filepath.Join(root, "src"), filepath.Join(root, "dst")
			for _, p := range []string{src, dst} {
				if tc.dir {
					must(t, os.Mkdir(p, 0o755))
				} else {
					must(t, os.WriteFile(p, nil, 0o644))
				}
			}
			for name, v := range map[string]string{
				"user.k": "v", "trusted.overlay.origin": "\x00\xfb\x1d", "trusted.overlay.impure": "y", opaqueXattr: "y",
			} {
				must(t, unix.Lsetxattr(src, name, []byte(v), 0))
			}
			must(t, copyXattrs(src, dst))
			got, err := listXattrs(dst)
			must(t, err)
			if !slices.Equal(got, []string{"user.k"}) {
				t.Errorf("%s copied with %v, want [user.k]", tc.name, got)
			}
		})
	}
}
