package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/pkg/localimage"
)

// upstreams are the registries critest names its images on; the daemon pulls from the local
// registry in their place (harness.Registry.WriteMirror), where the images are pushed below the
// same paths.
var upstreams = []string{"registry.k8s.io", "gcr.io", "k8s.gcr.io"}

const (
	e2eImages = "registry.k8s.io/e2e-test-images/"
	criImages = "gcr.io/k8s-staging-cri-tools/"
)

// testImage is one image critest names, made from the busybox image as cri-tools' own Dockerfiles
// make it (cri-tools/images) or, for the web servers, as a stand-in that does what the cases ask
// of it: refs are the names it is pushed as.
type testImage struct {
	refs   []string
	change localimage.Change
}

// testImages are the images critest pulls, bins the host paths of the built programs. Left out:
// the image it pins by digest (test-image-digest@sha256:9700f9...), which no local build
// reproduces; those cases fail alike with every handler.
func testImages(bins map[string]string) []testImage {
	file := func(name string) localimage.Change {
		return localimage.Change{Contents: map[string]string{name: name + "\n"}}
	}
	user := func(u string) localimage.Change {
		return localimage.Change{
			Contents: map[string]string{
				"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/false\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
			},
			Config: func(c *ocispec.ImageConfig) { c.User = u },
		}
	}
	// busybox's httpd in place of nginx and Apache: it serves a page with status 200 on port,
	// after a line in the log that names it (the multi-container case looks for "httpd"). A
	// process named nginx runs beside it with its pid where nginx's goes, and PID 1's command
	// line says "master process" as nginx's does (the PID namespace cases look for all three).
	// SIGTERM ends it at once.
	server := func(name string, port int) localimage.Change {
		script := fmt.Sprintf(`trap 'kill $web $nginx; exit 0' TERM
httpd -f -p %[2]d -h /www & web=$!
nginx & nginx=$!
mkdir -p /var/run && echo $nginx >/var/run/nginx.pid
echo "%[1]s: master process listening on port %[2]d"
wait`, name, port)
		return localimage.Change{
			Files:    map[string]string{"usr/sbin/nginx": bins["nginx"]},
			Contents: map[string]string{"www/index.html": "<h1>" + name + "</h1>\n"},
			Config:   func(c *ocispec.ImageConfig) { c.Entrypoint, c.Cmd = []string{"sh", "-c", script}, nil },
		}
	}
	images := []testImage{
		// /bin/ls a hard link of busybox, as in busybox's own image: masking a symbolic link
		// masks the busybox it points at, sh included (the MaskedPaths case masks /bin/ls).
		{refs: []string{e2eImages + "busybox:1.29-2"}, change: localimage.Change{Links: map[string]string{"bin/ls": "bin/busybox"}}},
		{refs: []string{e2eImages + "nonewprivs:1.3"}, change: localimage.Change{
			Files:  map[string]string{"usr/local/bin/nnp": bins["nnp"]},
			Modes:  map[string]os.FileMode{"usr/local/bin/nnp": os.ModeSetuid | 0o755},
			Config: func(c *ocispec.ImageConfig) { c.Entrypoint, c.Cmd = []string{"/usr/local/bin/nnp"}, nil },
		}},
		{refs: []string{e2eImages + "nginx:1.14-2"}, change: server("nginx", 80)},
		{refs: []string{e2eImages + "httpd:2.4.39-4"}, change: server("httpd", 80)},
		{refs: []string{criImages + "hostnet-nginx-amd64:latest"}, change: server("nginx", 12003)},
		// An image of its own, not busybox's under another name (an image manager case counts
		// the names of one image).
		{refs: []string{"registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9"}, change: file("pause")},
		{refs: []string{criImages + "test-image-tags:1", criImages + "test-image-tags:2", criImages + "test-image-tags:3"}, change: file("same-image")},
		{refs: []string{criImages + "test-image-user-uid:latest"}, change: user("1002")},
		{refs: []string{criImages + "test-image-user-username:latest"}, change: user("www-data")},
		{refs: []string{criImages + "test-image-user-uid-group:latest"}, change: user("1003:1004")},
		{refs: []string{criImages + "test-image-user-username-group:latest"}, change: user("www-data:1004")},
		{refs: []string{criImages + "test-image-predefined-group:latest"}, change: localimage.Change{
			Contents: map[string]string{
				"etc/passwd": "root:x:0:0:root:/root:/bin/sh\ndefault-user:x:1000:1000::/home/default-user:/bin/sh\n",
				"etc/group":  "root:x:0:\ndefault-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n",
			},
			Config: func(c *ocispec.ImageConfig) { c.User = "1000" },
		}},
	}
	// Images that differ by a file named after them, as cri-tools' image-test builds them.
	for _, name := range []string{"test-image-latest:latest", "test-image-tag:test", "test-image-tag:all",
		"test-image-1:latest", "test-image-2:latest", "test-image-3:latest"} {
		images = append(images, testImage{refs: []string{criImages + name}, change: file(strings.ReplaceAll(name, ":", "-"))})
	}
	return images
}

// programs are the C programs of some images, by name, built statically (the images have no
// libc).
var programs = map[string]string{
	// The e2e nonewprivs image's, run setuid root: it prints the effective uid, 0 unless
	// no_new_privs kept the setuid bit from acting.
	"nnp": `#include <stdio.h>
#include <unistd.h>
int main(void) { printf("Effective uid: %d\n", geteuid()); return 0; }
`,
	// nginx by name only, for the web server stand-ins: it waits for a signal.
	"nginx": `#include <unistd.h>
int main(void) { for (;;) pause(); }
`,
}

// buildPrograms builds programs into dir and returns their paths by name.
func buildPrograms(ctx context.Context, dir string) (map[string]string, error) {
	bins := map[string]string{}
	for name, source := range programs {
		src, bin := filepath.Join(dir, name+".c"), filepath.Join(dir, name)
		if err := os.WriteFile(src, []byte(source), 0o644); err != nil {
			return nil, err
		}
		if out, err := exec.CommandContext(ctx, "gcc", "-static", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s: %w: %s", src, err, out)
		}
		bins[name] = bin
	}
	return bins, nil
}

// pushTestImages builds testImages below dir and pushes them to reg, each name below its path
// without the upstream registry.
func pushTestImages(ctx context.Context, reg *harness.Registry, dir string) error {
	busybox, err := localimage.Busybox(ctx, localimage.CacheDir(), os.Stderr)
	if err != nil {
		return err
	}
	bins, err := buildPrograms(ctx, dir)
	if err != nil {
		return err
	}
	for i, ti := range testImages(bins) {
		img, err := localimage.Derive(ctx, busybox, filepath.Join(dir, fmt.Sprintf("image-%d", i)), ti.refs[0], ti.change)
		if err != nil {
			return err
		}
		for _, ref := range ti.refs {
			_, path, _ := strings.Cut(ref, "/")
			if _, err := reg.Push(ctx, img, path); err != nil {
				return err
			}
		}
	}
	return nil
}
