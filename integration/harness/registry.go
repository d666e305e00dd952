package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cklite/cklite/pkg/localimage"
)

// Registry is a private OCI registry (distribution) on loopback, storing into its own directory.
type Registry struct {
	// Addr is host:port; image references on it are Addr + "/" + repository.
	Addr  string
	dir   string
	stack *Stack
	proc  *proc
}

// StartRegistry starts a registry listening on addr, or on a free loopback port when addr is
// empty, storing into a fresh directory under DefaultBaseDir that Close removes.
func StartRegistry(stack *Stack, addr string) (*Registry, error) {
	if addr == "" {
		var err error
		if addr, err = freeLoopbackAddr(); err != nil {
			return nil, err
		}
	} else if err := addrFree(addr); err != nil {
		return nil, err
	}
	dir, err := newRunDir("registry-")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "storage"), 0o755); err != nil {
		return nil, err
	}
	config := filepath.Join(dir, "config.yml")
	err = os.WriteFile(config, []byte(fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, filepath.Join(dir, "storage"), addr)), 0o644)
	if err != nil {
		return nil, err
	}
	p, err := startProc("registry", filepath.Join(dir, "registry.log"), []string{"PATH=" + stack.Path()},
		filepath.Join(stack.Bin, "registry"), "serve", config)
	if err != nil {
		return nil, err
	}
	r := &Registry{Addr: addr, dir: dir, stack: stack, proc: p}
	client := &http.Client{Timeout: time.Second}
	err = p.waitReady(20*time.Second, func() error {
		resp, err := client.Get("http://" + addr + "/v2/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /v2/: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// Push copies a locally built image into the registry as repo (e.g. "cklite/busybox:latest") and
// returns its full reference.
func (r *Registry) Push(ctx context.Context, img localimage.Image, repo string) (string, error) {
	ref := r.Addr + "/" + repo
	cmd := exec.CommandContext(ctx, filepath.Join(r.stack.Bin, "crane"), "push", "--insecure", img.Layout, ref)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("crane push %s %s: %w: %s", img.Layout, ref, err, strings.TrimSpace(string(out)))
	}
	return ref, nil
}

// WriteHostsDir writes the containerd hosts.toml under hostsDir that lets containerd and nerdctl
// pull from and push to this registry over plain HTTP.
func (r *Registry) WriteHostsDir(hostsDir string) error {
	dir := filepath.Join(hostsDir, r.Addr)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(fmt.Sprintf(`server = "http://%[1]s"

[host."http://%[1]s"]
  capabilities = ["pull", "resolve", "push"]
  skip_verify = true
`, r.Addr)), 0o644)
}

// WriteMirror writes the containerd hosts.toml under hostsDir that makes this registry a pull
// mirror of upstream (a registry host such as registry.k8s.io): images named upstream/repo:tag are
// pulled from this registry's repo:tag, over plain HTTP, and from upstream only when it has
// none.
func (r *Registry) WriteMirror(hostsDir, upstream string) error {
	dir := filepath.Join(hostsDir, upstream)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(fmt.Sprintf(`server = "https://%s"

[host."http://%s"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
`, upstream, r.Addr)), 0o644)
}

// Close stops the registry and removes its storage.
func (r *Registry) Close() error {
	return errors.Join(r.proc.stop(5*time.Second), os.RemoveAll(r.dir))
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// addrFree fails with a message naming the address when something already listens on it.
func addrFree(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("address %s is already in use (another registry or a previous run still running?): %w", addr, err)
	}
	return l.Close()
}
