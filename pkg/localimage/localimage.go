// Package localimage builds the container images cklite's tests, demo and benchmark run, on a
// machine that reaches no image registry: a busybox image from Debian's busybox-static package and
// an agent sandbox image (debootstrap minbase + python3). Each is kept as an OCI image layout plus
// an importable archive in a cache directory and rebuilt only when missing.
package localimage

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// CacheDir is where built images are kept between runs: images/ under $CKLITE_CACHE, the cache
// directory contrib/install.sh uses too (default /var/cache/cklite).
func CacheDir() string {
	if dir := os.Getenv("CKLITE_CACHE"); dir != "" {
		return filepath.Join(dir, "images")
	}
	return "/var/cache/cklite/images"
}

// Image is a locally built image.
type Image struct {
	// Name is the reference `ctr images import` and `nerdctl load` give it.
	Name string
	// Layout is the OCI image layout directory (what crane pushes to a registry).
	Layout string
	// Archive is the layout as a tar (what ctr and nerdctl import).
	Archive string
}

// recipe says how to make one image's root filesystem.
type recipe struct {
	key    string // cache sub-directory
	name   string
	config ocispec.ImageConfig
	build  func(ctx context.Context, rootfs, work string, log io.Writer) error
}

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

var (
	busybox = recipe{
		key:    "busybox",
		name:   "localhost/cklite/busybox:latest",
		config: ocispec.ImageConfig{Env: []string{defaultPath}, Cmd: []string{"sh"}},
		build:  buildBusybox,
	}
	sandbox = recipe{
		key:    "sandbox",
		name:   "localhost/cklite/sandbox:latest",
		config: ocispec.ImageConfig{Env: []string{defaultPath, "LANG=C.UTF-8"}, Cmd: []string{"python3"}},
		build:  buildSandbox,
	}
	// pause holds a pod's namespaces for the CRI plugin (its sandbox image), doing what
	// Kubernetes' pause binary does: nothing, but reap. In a pod that shares its PID namespace,
	// pause is PID 1 there and the parent of every orphan, containers' inits included: a zombie it
	// left would keep its pid taken, and CRIU could not restore a process with that pid. busybox
	// ash waits for any child while it waits for its sleep. A pod's sandbox is stopped with SIGKILL.
	pause = recipe{
		key:    "pause",
		name:   PauseName,
		config: ocispec.ImageConfig{Env: []string{defaultPath}, Entrypoint: []string{"/bin/sh", "-c", "while :; do sleep 3600 & wait $!; done"}},
		build:  buildBusybox,
	}
)

// PauseName is the reference of the pause image (see Pause), which a CRI configuration names as
// its sandbox image.
const PauseName = "localhost/cklite/pause:latest"

// Busybox returns the busybox image (a static busybox with its applet links), building it first
// when the cache does not hold it; progress gets a line when a build starts.
func Busybox(ctx context.Context, cacheDir string, progress io.Writer) (Image, error) {
	return get(ctx, cacheDir, busybox, progress)
}

// Sandbox returns the agent sandbox image (Debian bookworm minbase with python3), building it
// first when the cache does not hold it. The first build runs debootstrap and takes a minute or two.
func Sandbox(ctx context.Context, cacheDir string, progress io.Writer) (Image, error) {
	return get(ctx, cacheDir, sandbox, progress)
}

// Pause returns the pod sandbox image for the CRI plugin: busybox sleeping forever, building it
// first when the cache does not hold it.
func Pause(ctx context.Context, cacheDir string, progress io.Writer) (Image, error) {
	return get(ctx, cacheDir, pause, progress)
}

func get(ctx context.Context, cacheDir string, r recipe, progress io.Writer) (Image, error) {
	dir := filepath.Join(cacheDir, r.key)
	img := Image{Name: r.name, Layout: filepath.Join(dir, "layout"), Archive: filepath.Join(dir, "image.tar")}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Image{}, err
	}
	// Test packages run in parallel and may all ask for the same image: one builds, the others wait.
	unlock, err := lock(filepath.Join(dir, ".lock"))
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	// The archive is renamed into place last, so its presence means the whole image is there.
	if _, err := os.Stat(img.Archive); err == nil {
		return img, nil
	}
	buildLog := filepath.Join(dir, "build.log")
	logf, err := os.Create(buildLog)
	if err != nil {
		return Image{}, err
	}
	defer logf.Close()
	fmt.Fprintf(progress, "localimage: building %s (log: %s)\n", r.name, buildLog)
	work := filepath.Join(dir, "work")
	rootfs := filepath.Join(work, "rootfs")
	if err := freshRootfs(rootfs, work, img.Layout); err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(work)
	if err := r.build(ctx, rootfs, work, logf); err != nil {
		return Image{}, fmt.Errorf("building %s: %w (log: %s)", r.name, err, buildLog)
	}
	if err := pack(rootfs, img, r.config); err != nil {
		return Image{}, err
	}
	return img, nil
}

// freshRootfs removes what an earlier, interrupted build left in the stale directories and makes
// an empty rootfs.
func freshRootfs(rootfs string, stale ...string) error {
	for _, p := range stale {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	return os.MkdirAll(rootfs, 0o755)
}

// pack writes rootfs as img's one-layer layout, then its archive.
func pack(rootfs string, img Image, cfg ocispec.ImageConfig) error {
	if err := writeLayout(rootfs, img.Layout, img.Name, cfg); err != nil {
		return fmt.Errorf("building %s: %w", img.Name, err)
	}
	if err := writeArchive(img.Layout, img.Archive); err != nil {
		return fmt.Errorf("building %s: %w", img.Name, err)
	}
	return nil
}

func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

func run(ctx context.Context, log io.Writer, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

// buildBusybox unpacks Debian's busybox-static into rootfs and adds what a container needs around it.
func buildBusybox(ctx context.Context, rootfs, work string, log io.Writer) error {
	deb, err := downloadDeb(ctx, work, "busybox-static", log)
	if err != nil {
		return err
	}
	if err := run(ctx, log, work, "dpkg-deb", "-x", deb, rootfs); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(rootfs, "usr", "share")); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, filepath.Join(rootfs, "bin", "busybox"), "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox --list-full: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		link := filepath.Join(rootfs, applet)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("/bin/busybox", link); err != nil {
			return err
		}
	}
	for dir, mode := range map[string]os.FileMode{"tmp": 0o1777, "root": 0o700, "proc": 0o555, "sys": 0o555, "dev": 0o755, "etc": 0o755, "var": 0o755, "run": 0o755} {
		if err := os.MkdirAll(filepath.Join(rootfs, dir), 0o755); err != nil {
			return err
		}
		if err := os.Chmod(filepath.Join(rootfs, dir), mode); err != nil {
			return err
		}
	}
	for name, content := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":  "root:x:0:\nnobody:x:65534:\n",
	} {
		if err := os.WriteFile(filepath.Join(rootfs, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// downloadDeb fetches a package's .deb from the host's configured Debian archive into dir.
// A machine whose package lists were never fetched gets one `apt-get update` first.
func downloadDeb(ctx context.Context, dir, pkg string, log io.Writer) (string, error) {
	err := run(ctx, log, dir, "apt-get", "download", pkg)
	if err != nil {
		if uerr := run(ctx, log, dir, "apt-get", "update"); uerr != nil {
			return "", fmt.Errorf("apt-get download %s failed (%w) and so did apt-get update: %w", pkg, err, uerr)
		}
		if err = run(ctx, log, dir, "apt-get", "download", pkg); err != nil {
			return "", err
		}
	}
	debs, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download %s left %d .deb files in %s", pkg, len(debs), dir)
	}
	return debs[0], nil
}

// buildSandbox makes a Debian bookworm minbase root with python3: what an agent's sandbox holds.
func buildSandbox(ctx context.Context, rootfs, work string, log io.Writer) error {
	mirror, err := debianMirror("/etc/apt")
	if err != nil {
		return err
	}
	if err := run(ctx, log, work, "debootstrap", "--variant=minbase", "--include=python3", "bookworm", rootfs, mirror); err != nil {
		return err
	}
	// Package caches are build leftovers, not part of a sandbox.
	for _, pattern := range []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_Packages"} {
		matches, _ := filepath.Glob(filepath.Join(rootfs, pattern))
		for _, m := range matches {
			if err := os.Remove(m); err != nil {
				return err
			}
		}
	}
	return nil
}

// debianMirror returns the first Debian archive URI the host's apt sources name (not the security
// archive), so debootstrap uses the same mirror apt does.
func debianMirror(aptDir string) (string, error) {
	var uris []string
	sources, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*.sources"))
	for _, p := range sources {
		uris = append(uris, scanLines(p, func(f []string) []string {
			if len(f) > 1 && f[0] == "URIs:" {
				return f[1:]
			}
			return nil
		})...)
	}
	lists, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*.list"))
	for _, p := range append([]string{filepath.Join(aptDir, "sources.list")}, lists...) {
		uris = append(uris, scanLines(p, func(f []string) []string {
			if len(f) == 0 || f[0] != "deb" {
				return nil
			}
			for _, w := range f[1:] {
				if strings.Contains(w, "://") {
					return []string{w}
				}
			}
			return nil
		})...)
	}
	for _, u := range uris {
		if !strings.Contains(u, "-security") && strings.Contains(u, "debian") {
			return u, nil
		}
	}
	return "", errors.New("no Debian archive URI in the apt sources under " + aptDir + " for debootstrap to use")
}

func scanLines(path string, pick func(fields []string) []string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		out = append(out, pick(strings.Fields(s.Text()))...)
	}
	return out
}
