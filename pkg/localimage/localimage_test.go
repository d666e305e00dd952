package localimage

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

func TestWriteLayout(t *testing.T) {
	root := filepath.Join(t.TempDir(), "rootfs")
	must(t, os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "bin", "tool"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.Link(filepath.Join(root, "bin", "tool"), filepath.Join(root, "bin", "alias")))
	must(t, os.Symlink("/bin/tool", filepath.Join(root, "bin", "sym")))
	must(t, os.Chown(filepath.Join(root, "bin", "tool"), 1234, 5678))
	xattrs := unix.Lsetxattr(filepath.Join(root, "bin", "tool"), "user.cklite", []byte("v"), 0) == nil

	layout := filepath.Join(t.TempDir(), "layout")
	must(t, writeLayout(root, layout, "localhost/test:latest", ocispec.ImageConfig{Cmd: []string{"sh"}}))

	var index ocispec.Index
	readJSON(t, filepath.Join(layout, "index.json"), &index)
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations[annotationImageName] != "localhost/test:latest" {
		t.Fatalf("index manifests = %+v", index.Manifests)
	}
	var manifest ocispec.Manifest
	readJSON(t, blobPath(layout, index.Manifests[0]), &manifest)
	var config ocispec.Image
	readJSON(t, blobPath(layout, manifest.Config), &config)
	if len(manifest.Layers) != 1 || config.RootFS.DiffIDs[0] != manifest.Layers[0].Digest {
		t.Fatalf("uncompressed layer digest must equal diff id: layers %+v, diff ids %v", manifest.Layers, config.RootFS.DiffIDs)
	}

	entries := tarEntries(t, blobPath(layout, manifest.Layers[0]))
	tool, alias, sym := entries["bin/tool"], entries["bin/alias"], entries["bin/sym"]
	if tool == nil || alias == nil || sym == nil || entries["bin/"] == nil {
		t.Fatalf("missing entries: %v", entries)
	}
	if tool.Uid != 1234 || tool.Gid != 5678 || tool.Uname != "" {
		t.Errorf("owner = %d:%d %q, want numeric 1234:5678", tool.Uid, tool.Gid, tool.Uname)
	}
	// WalkDir visits bin/alias before bin/tool, so alias holds the data and tool links to it.
	if tool.Typeflag != tar.TypeLink || tool.Linkname != "bin/alias" {
		t.Errorf("bin/tool = type %c -> %q, want a hard link to bin/alias", tool.Typeflag, tool.Linkname)
	}
	if sym.Typeflag != tar.TypeSymlink || sym.Linkname != "/bin/tool" {
		t.Errorf("bin/sym = type %c -> %q", sym.Typeflag, sym.Linkname)
	}
	if xattrs && alias.PAXRecords["SCHILY.xattr.user.cklite"] != "v" {
		t.Errorf("xattr lost: %v", alias.PAXRecords)
	}

	archive := filepath.Join(t.TempDir(), "image.tar")
	must(t, writeArchive(layout, archive))
	names := tarEntries(t, archive)
	for _, want := range []string{"oci-layout", "index.json", "blobs/sha256/" + manifest.Layers[0].Digest.Encoded()} {
		if names[want] == nil {
			t.Errorf("archive lacks %s: %v", want, names)
		}
	}
}

func TestDebianMirror(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   map[string]string
		want    string
		wantErr bool
	}{
		{
			name: "deb822 skips security",
			files: map[string]string{"sources.list.d/debian.sources": "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\n\n" +
				"Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n"},
			want: "http://mirror.example/debian",
		},
		{
			name:  "one-line format with options",
			files: map[string]string{"sources.list": "# comment\ndeb [arch=amd64] http://m.example/debian bookworm main\n"},
			want:  "http://m.example/debian",
		},
		{
			name:    "nothing usable",
			files:   map[string]string{"sources.list": "deb-src http://m.example/debian bookworm main\n"},
			wantErr: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tc.files {
				must(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
				must(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
			}
			got, err := debianMirror(dir)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("got %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// tarEntries reads the headers of the tar at path by name.
func tarEntries(t *testing.T, path string) map[string]*tar.Header {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	entries := map[string]*tar.Header{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return entries
		}
		must(t, err)
		entries[hdr.Name] = hdr
	}
}

func blobPath(layout string, d ocispec.Descriptor) string {
	return filepath.Join(layout, "blobs", d.Digest.Algorithm().String(), d.Digest.Encoded())
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	must(t, err)
	must(t, json.Unmarshal(data, v))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
