package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/pkg/localimage"
)

// The repositories critest pulls from, below its --registry-prefix (which replaces
// registry.k8s.io and gcr.io in the names it pulls).
const (
	e2eImages = "e2e-test-images/"
	criImages = "k8s-staging-cri-tools/"
)

// webRoot is where the web server image serves its page from.
const webRoot = "/usr/share/nginx/html"

// testImage is one image critest names, made from the busybox image as cri-tools' own Dockerfiles
// make it (cri-tools/images): refs are the repositories and tags it is pushed as.
type testImage struct {
	refs   []string
	change localimage.Change
}

// testImages are the images critest pulls through its registry prefix. Left out: the image pinned
// by digest (test-image-digest@sha256:9700f9...: no local build has that digest), and httpd and
// hostnet-nginx, which critest creates containers of by their public names (it pulls them through
// the prefix, then cannot find them by name): those cases fail alike with every handler.
func testImages() []testImage {
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
	images := []testImage{
		{refs: []string{e2eImages + "busybox:1.29-2"}},
		// A web server on port 80 answering 200, what the networking cases ask of nginx.
		{refs: []string{e2eImages + "nginx:1.14-2"}, change: localimage.Change{
			Contents: map[string]string{strings.TrimPrefix(webRoot, "/") + "/index.html": "<h1>Welcome to nginx!</h1>\n"},
			Config: func(c *ocispec.ImageConfig) {
				c.Entrypoint, c.Cmd = []string{"httpd", "-f", "-p", "80", "-h", webRoot}, nil
			},
		}},
		{refs: []string{"pause:3.9"}},
		// Three tags of one image.
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

// pushTestImages builds testImages below dir and pushes them to reg, and writes the file critest's
// --test-images-file reads: its default container and web server images on reg. It returns that
// file's path.
func pushTestImages(ctx context.Context, reg *harness.Registry, dir string) (string, error) {
	busybox, err := localimage.Busybox(ctx, localimage.CacheDir(), os.Stderr)
	if err != nil {
		return "", err
	}
	for i, ti := range testImages() {
		img, err := localimage.Derive(ctx, busybox, filepath.Join(dir, fmt.Sprintf("image-%d", i)), "localhost/critest/"+ti.refs[0], ti.change)
		if err != nil {
			return "", err
		}
		for _, ref := range ti.refs {
			if _, err := reg.Push(ctx, img, ref); err != nil {
				return "", err
			}
		}
	}
	path := filepath.Join(dir, "test-images.yaml")
	content := fmt.Sprintf("defaultTestContainerImage: %s/%sbusybox:1.29-2\nwebServerTestImage: %s/%snginx:1.14-2\n",
		reg.Addr, e2eImages, reg.Addr, e2eImages)
	return path, os.WriteFile(path, []byte(content), 0o644)
}
