package localimage

import (
	"os"
	"path/filepath"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// TestExtend: the extended image holds the base's files, the added one (executable), and the
// base's config.
func TestExtend(t *testing.T) {
	root := filepath.Join(t.TempDir(), "rootfs")
	must(t, os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "bin", "sh"), []byte("base"), 0o755))
	base := Image{Name: "localhost/base:latest", Layout: filepath.Join(t.TempDir(), "layout")}
	must(t, writeLayout(root, base.Layout, base.Name, ocispec.ImageConfig{Cmd: []string{"sh"}}))
	probe := filepath.Join(t.TempDir(), "probe")
	must(t, os.WriteFile(probe, []byte("added"), 0o600))

	img, err := Extend(t.Context(), base, t.TempDir(), "localhost/extended:latest", map[string]string{"/usr/bin/probe": probe})
	if err != nil {
		t.Fatal(err)
	}
	var index ocispec.Index
	readJSON(t, filepath.Join(img.Layout, "index.json"), &index)
	var manifest ocispec.Manifest
	readJSON(t, blobPath(img.Layout, index.Manifests[0]), &manifest)
	var config ocispec.Image
	readJSON(t, blobPath(img.Layout, manifest.Config), &config)
	if len(config.Config.Cmd) != 1 || config.Config.Cmd[0] != "sh" {
		t.Errorf("config cmd = %v, want the base's [sh]", config.Config.Cmd)
	}
	entries := tarEntries(t, blobPath(img.Layout, manifest.Layers[0]))
	if entries["bin/sh"] == nil {
		t.Errorf("the base's bin/sh is missing: %v", entries)
	}
	if p := entries["usr/bin/probe"]; p == nil || p.Mode&0o111 == 0 {
		t.Errorf("usr/bin/probe = %+v, want an executable file", p)
	}
	if _, err := os.Stat(img.Archive); err != nil {
		t.Errorf("archive: %v", err)
	}
}
