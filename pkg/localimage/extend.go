package localimage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Extend builds image name into dir: base's root filesystem with files added (path in the image
// -> path on the host, copied with mode 0755), as one layer. It reads base and writes only below
// dir, so a caller may put a short-lived image (a benchmark's, with a freshly built helper
// binary) in a directory of its own instead of the shared cache.
func Extend(ctx context.Context, base Image, dir, name string, files map[string]string) (Image, error) {
	return Derive(ctx, base, dir, name, Change{Files: files})
}

// Change is what Derive changes in a base image.
type Change struct {
	// Files are copied into the image with mode 0755: path in the image -> path on the host.
	Files map[string]string
	// Contents are written into the image with mode 0644: path in the image -> content. Text
	// files such as /etc/passwd or a web server's page, which callers need not write to the
	// host first.
	Contents map[string]string
	// Links make paths in the image hard links of other files of it: path -> target, both in
	// the image; what was at path (a symbolic link, say) is replaced.
	Links map[string]string
	// Modes are set last, on files of the base or added: path in the image -> mode, setuid and
	// setgid bits included.
	Modes map[string]os.FileMode
	// Config, when set, edits the image's config (user, entrypoint, labels); base's is kept
	// otherwise.
	Config func(*ocispec.ImageConfig)
}

// Derive builds image name into dir: base's root filesystem and config changed as change says, as
// one layer. Like Extend, it reads base and writes only below dir.
func Derive(ctx context.Context, base Image, dir, name string, change Change) (Image, error) {
	img := Image{Name: name, Layout: filepath.Join(dir, "layout"), Archive: filepath.Join(dir, "image.tar")}
	rootfs := filepath.Join(dir, "rootfs")
	if err := freshRootfs(rootfs, rootfs, img.Layout); err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(rootfs)
	cfg, layers, err := readLayout(base.Layout)
	if err != nil {
		return Image{}, fmt.Errorf("reading %s: %w", base.Layout, err)
	}
	for _, l := range layers {
		// tar keeps owners, modes, links and device nodes exactly as packed; base layers are
		// uncompressed (writeLayout), and tar detects compression anyway.
		out, err := exec.CommandContext(ctx, "tar", "-x", "--numeric-owner", "-p", "-C", rootfs, "-f", l).CombinedOutput()
		if err != nil {
			return Image{}, fmt.Errorf("unpacking %s: %w: %s", l, err, strings.TrimSpace(string(out)))
		}
	}
	for inImage, host := range change.Files {
		if err := copyExecutable(host, filepath.Join(rootfs, inImage)); err != nil {
			return Image{}, err
		}
	}
	for inImage, content := range change.Contents {
		if err := writeContent(filepath.Join(rootfs, inImage), content); err != nil {
			return Image{}, err
		}
	}
	for inImage, target := range change.Links {
		if err := replaceWith(filepath.Join(rootfs, inImage), func(path string) error {
			return os.Link(filepath.Join(rootfs, target), path)
		}); err != nil {
			return Image{}, err
		}
	}
	for inImage, mode := range change.Modes {
		if err := os.Chmod(filepath.Join(rootfs, inImage), mode); err != nil {
			return Image{}, err
		}
	}
	if change.Config != nil {
		change.Config(&cfg)
	}
	if err := pack(rootfs, img, cfg); err != nil {
		return Image{}, err
	}
	return img, nil
}

func writeContent(path, content string) error {
	return replaceWith(path, func(path string) error { return os.WriteFile(path, []byte(content), 0o644) })
}

// replaceWith removes what is at path and makes path anew with make. Removed first: the base may
// hold a symbolic link there (busybox's applets), which a write would follow out of the image.
func replaceWith(path string, make func(string) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return make(path)
}

// readLayout returns the config of a layout's one image and the paths of its layer blobs.
func readLayout(layout string) (ocispec.ImageConfig, []string, error) {
	blob := func(d ocispec.Descriptor) string {
		return filepath.Join(layout, "blobs", d.Digest.Algorithm().String(), d.Digest.Encoded())
	}
	var index ocispec.Index
	if err := readJSONFile(filepath.Join(layout, ocispec.ImageIndexFile), &index); err != nil {
		return ocispec.ImageConfig{}, nil, err
	}
	if len(index.Manifests) != 1 {
		return ocispec.ImageConfig{}, nil, fmt.Errorf("index lists %d manifests, want 1", len(index.Manifests))
	}
	var manifest ocispec.Manifest
	if err := readJSONFile(blob(index.Manifests[0]), &manifest); err != nil {
		return ocispec.ImageConfig{}, nil, err
	}
	var config ocispec.Image
	if err := readJSONFile(blob(manifest.Config), &config); err != nil {
		return ocispec.ImageConfig{}, nil, err
	}
	var layers []string
	for _, l := range manifest.Layers {
		layers = append(layers, blob(l))
	}
	return config.Config, layers, nil
}

func readJSONFile(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return out.Close()
}
