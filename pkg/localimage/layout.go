package localimage

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// annotationImageName is the index.json annotation that `ctr images import` and `nerdctl load` take
// the image name from (containerd's images.AnnotationImageName).
const annotationImageName = "io.containerd.image.name"

// writeLayout packs rootfs into a one-layer OCI image layout at dir: an uncompressed layer tar
// with numeric owners, xattrs, hard links and device nodes as they are on disk.
func writeLayout(rootfs, dir, name string, cfg ocispec.ImageConfig) error {
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return err
	}
	layer, err := writeBlob(blobs, func(w io.Writer) error { return tarRootfs(rootfs, w) })
	if err != nil {
		return fmt.Errorf("packing %s: %w", rootfs, err)
	}
	layer.MediaType = ocispec.MediaTypeImageLayer
	config, err := writeJSONBlob(blobs, ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		Config:   cfg,
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{layer.Digest}},
	})
	if err != nil {
		return err
	}
	config.MediaType = ocispec.MediaTypeImageConfig
	manifest, err := writeJSONBlob(blobs, ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    config,
		Layers:    []ocispec.Descriptor{layer},
	})
	if err != nil {
		return err
	}
	manifest.MediaType = ocispec.MediaTypeImageManifest
	manifest.Platform = &ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
	manifest.Annotations = map[string]string{annotationImageName: name, ocispec.AnnotationRefName: "latest"}
	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manifest},
	})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ocispec.ImageIndexFile), index, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ocispec.ImageLayoutFile), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
}

// writeBlob stores what write produces under its sha256 in blobs and describes it.
func writeBlob(blobs string, write func(io.Writer) error) (ocispec.Descriptor, error) {
	f, err := os.CreateTemp(blobs, ".blob-")
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(f, h)}
	if err := write(cw); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := f.Close(); err != nil {
		return ocispec.Descriptor{}, err
	}
	hexsum := hex.EncodeToString(h.Sum(nil))
	if err := os.Rename(f.Name(), filepath.Join(blobs, hexsum)); err != nil {
		return ocispec.Descriptor{}, err
	}
	return ocispec.Descriptor{Digest: digest.NewDigestFromEncoded(digest.SHA256, hexsum), Size: cw.n}, nil
}

func writeJSONBlob(blobs string, v any) (ocispec.Descriptor, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return writeBlob(blobs, func(w io.Writer) error { _, err := w.Write(data); return err })
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// tarRootfs writes the tree under root as a tar (a layer, or an image layout archive). Owners stay numeric (the image's ids are
// not the host's names), and a second path to an inode becomes a hard link entry.
func tarRootfs(root string, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[uint64]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var target string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		hdr.Name = rel
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		hdr.AccessTime, hdr.ChangeTime = fi.ModTime(), fi.ModTime()
		hdr.Format = tar.FormatPAX
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			if first, seen := links[st.Ino]; seen {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[st.Ino] = rel
			}
		}
		if err := addXattrs(path, hdr); err != nil {
			return err
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// addXattrs carries extended attributes (file capabilities above all) into the tar header.
func addXattrs(path string, hdr *tar.Header) error {
	size, err := unix.Llistxattr(path, nil)
	if err != nil || size == 0 {
		if err == unix.ENOTSUP {
			return nil
		}
		return err
	}
	buf := make([]byte, size)
	if size, err = unix.Llistxattr(path, buf); err != nil {
		return err
	}
	for _, key := range splitNul(buf[:size]) {
		vsize, err := unix.Lgetxattr(path, key, nil)
		if err != nil {
			return fmt.Errorf("xattr %s of %s: %w", key, path, err)
		}
		val := make([]byte, vsize)
		if vsize, err = unix.Lgetxattr(path, key, val); err != nil {
			return fmt.Errorf("xattr %s of %s: %w", key, path, err)
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+key] = string(val[:vsize])
	}
	return nil
}

func splitNul(b []byte) []string {
	var out []string
	start := 0
	for i, c := range b {
		if c == 0 {
			if i > start {
				out = append(out, string(b[start:i]))
			}
			start = i + 1
		}
	}
	return out
}

// writeArchive tars an OCI image layout directory into the archive that `ctr images import` and
// `nerdctl load` read, renaming it into place only when complete.
func writeArchive(layout, archive string) error {
	tmp := archive + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	defer f.Close()
	if err := tarRootfs(layout, f); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, archive)
}
