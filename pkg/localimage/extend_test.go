package localimage

import (
	"archive/tar"
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
	config, entries := readImage(t, img.Layout)
	if len(config.Config.Cmd) != 1 || config.Config.Cmd[0] != "sh" {
		t.Errorf("config cmd = %v, want the base's [sh]", config.Config.Cmd)
	}
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

// TestDerive: a derived image holds the base's files, a written file replacing the base's symbolic
// link (not written through it), a hard link replacing another, a mode with the setuid bit, and the base's config as Config
// edited it.
func TestDerive(t *testing.T) {
	root := filepath.Join(t.TempDir(), "rootfs")
	must(t, os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	must(t, os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "bin", "sh"), []byte("base"), 0o755))
	must(t, os.Symlink("../bin/sh", filepath.Join(root, "etc", "passwd")))
	must(t, os.Symlink("sh", filepath.Join(root, "bin", "ls")))
	base := Image{Name: "localhost/base:latest", Layout: filepath.Join(t.TempDir(), "layout")}
	must(t, writeLayout(root, base.Layout, base.Name, ocispec.ImageConfig{Cmd: []string{"sh"}}))

	img, err := Derive(t.Context(), base, t.TempDir(), "localhost/derived:latest", Change{
		Contents: map[string]string{"etc/passwd": "www-data:x:33:33::/:/bin/sh\n"},
		Modes:    map[string]os.FileMode{"bin/sh": os.ModeSetuid | 0o755},
		Links:    map[string]string{"bin/ls": "bin/sh"},
		Config:   func(c *ocispec.ImageConfig) { c.User = "www-data" },
	})
	if err != nil {
		t.Fatal(err)
	}
	config, entries := readImage(t, img.Layout)
	if config.Config.User != "www-data" || len(config.Config.Cmd) != 1 || config.Config.Cmd[0] != "sh" {
		t.Errorf("config user %q cmd %v, want www-data and the base's [sh]", config.Config.User, config.Config.Cmd)
	}
	if p := entries["etc/passwd"]; p == nil || p.Typeflag != tar.TypeReg || p.Size != int64(len("www-data:x:33:33::/:/bin/sh\n")) {
		t.Errorf("etc/passwd = %+v, want the written regular file", p)
	}
	// bin/sh and bin/ls are one file: the first in the layer holds it, the other links to it.
	file, link := entries["bin/ls"], entries["bin/sh"]
	if file != nil && file.Typeflag == tar.TypeLink {
		file, link = link, file
	}
	if file == nil || file.Size != int64(len("base")) || file.Mode != 0o4755 {
		t.Errorf("bin/sh or bin/ls = %+v, want the base's bin/sh, setuid", file)
	}
	if link == nil || link.Typeflag != tar.TypeLink || link.Linkname != file.Name {
		t.Errorf("bin/sh or bin/ls = %+v, want a hard link of the other, not a symbolic link", link)
	}
}

// readImage returns the config of a one-image layout and the entries of its one layer.
func readImage(t *testing.T, layout string) (ocispec.Image, map[string]*tar.Header) {
	t.Helper()
	var index ocispec.Index
	readJSON(t, filepath.Join(layout, "index.json"), &index)
	var manifest ocispec.Manifest
	readJSON(t, blobPath(layout, index.Manifests[0]), &manifest)
	var config ocispec.Image
	readJSON(t, blobPath(layout, manifest.Config), &config)
	return config, tarEntries(t, blobPath(layout, manifest.Layers[0]))
}
