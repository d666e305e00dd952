package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cklite/cklite/integration/harness"
)

// TestCRIHandlerFeatures checks what the CRI plugin learnt of the handlers by running their shims
// with `-info` at start-up, and the two kinds of pods that need those features (critest's
// "Container Mount Readonly" and "Security Context UserNamespaces" cases), on cklite:
//   - with an options table for the cklite handler, which CRI passes to `-info` as
//     runtimeoptions.v1.Options, cklite must advertise recursive read-only mounts and user
//     namespaces as runc does, and a host directory with a submount mounted recursively read-only
//     must be read-only inside, submount included. (Before the fix the handler had no features,
//     and containerd 2.4.2's CRI, dereferencing them, crashed on that mount.)
//   - with contrib/kubernetes's configuration (no table), the same features, and a pod in a user
//     namespace of its own runs with the mapping and the rootfs idmapped.
func TestCRIHandlerFeatures(t *testing.T) {
	t.Run("options table", func(t *testing.T) {
		table := filepath.Join(t.TempDir(), "cklite-options.toml")
		conf := "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.cklite.options]\n  NoNewKeyring = false\n"
		if err := os.WriteFile(table, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		d := startDaemon(t, harness.Config{CkliteSnapshotter: true, Imports: []string{table}})
		cri := criOf(t, d)
		checkHandlerFeatures(t, cri)
		checkRecursiveReadOnly(t, d, cri)
	})
	t.Run("contrib", func(t *testing.T) {
		_, cri := startCRI(t)
		checkHandlerFeatures(t, cri)
		checkUserNamespace(t, cri)
	})
}

// checkHandlerFeatures fails the test unless CRI's status gives cklite's and runc's handlers
// recursive read-only mounts and user namespaces.
func checkHandlerFeatures(t *testing.T, cri *harness.CRI) {
	t.Helper()
	st, err := cri.Runtime.Status(criContext(t), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	handlers := map[string]*runtimeapi.RuntimeHandlerFeatures{}
	for _, h := range st.GetRuntimeHandlers() {
		handlers[h.GetName()] = h.GetFeatures()
	}
	for _, name := range []string{harness.HandlerCklite, harness.HandlerRunc} {
		if f := handlers[name]; !f.GetRecursiveReadOnlyMounts() || !f.GetUserNamespaces() {
			t.Errorf("handler %q: features %v, want recursive read-only mounts and user namespaces (all handlers: %v)", name, f, st.GetRuntimeHandlers())
		}
	}
}

// checkRecursiveReadOnly mounts a host directory holding a tmpfs recursively read-only into a
// cklite pod: both must be read-only inside.
func checkRecursiveReadOnly(t *testing.T, d *harness.Daemon, cri *harness.CRI) {
	t.Helper()
	ctx := criContext(t)
	host := t.TempDir()
	sub := filepath.Join(host, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(sub, unix.MNT_DETACH) })
	pod, err := cri.RunPod(ctx, "rro", harness.HandlerCklite, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cri.RemovePod(criContext(t), pod) })
	cfg := pod.Container("app", busybox.Name, "sleep", "3600")
	cfg.Mounts = []*runtimeapi.Mount{{
		ContainerPath: "/mnt", HostPath: host, Readonly: true, RecursiveReadOnly: true,
		Propagation: runtimeapi.MountPropagation_PROPAGATION_PRIVATE,
	}}
	id, err := cri.StartContainer(ctx, pod, cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkRuntime(t, d, cri, id, harness.CkliteRuntime, "cklite")
	for _, path := range []string{"/mnt/f", "/mnt/sub/f"} {
		out, err := cri.Exec(ctx, id, "touch", path)
		if err == nil || !strings.Contains(err.Error(), "Read-only file system") {
			t.Errorf("touch %s in a recursively read-only mount: %q, %v; want Read-only file system", path, out, err)
		}
	}
}

// checkUserNamespace runs a cklite pod in a user namespace of its own: the container's root is
// the mapping's first host id, and the image's files, owned by the host's root, are the container
// root's (the rootfs idmapped).
func checkUserNamespace(t *testing.T, cri *harness.CRI) {
	t.Helper()
	ctx := criContext(t)
	useBridge(t, cri) // a pod in a user namespace cannot share the host's network
	cfg, err := cri.PodConfig("userns", false)
	if err != nil {
		t.Fatal(err)
	}
	mapping := []*runtimeapi.IDMapping{{HostId: 1 << 20, ContainerId: 0, Length: 65536}}
	cfg.Linux.SecurityContext.NamespaceOptions.UsernsOptions = &runtimeapi.UserNamespace{
		Mode: runtimeapi.NamespaceMode_POD, Uids: mapping, Gids: mapping,
	}
	pod, err := cri.RunPodConfig(ctx, cfg, harness.HandlerCklite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cri.RemovePod(criContext(t), pod) })
	id, err := cri.StartContainer(ctx, pod, pod.Container("app", busybox.Name, "sleep", "3600"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cri.Exec(ctx, id, "cat", "/proc/self/uid_map"); err != nil || strings.Join(strings.Fields(out), " ") != "0 1048576 65536" {
		t.Errorf("uid_map in a user-namespaced pod: %q, %v; want 0 1048576 65536", out, err)
	}
	if out, err := cri.Exec(ctx, id, "stat", "-c", "%u", "/bin"); err != nil || strings.TrimSpace(out) != "0" {
		t.Errorf("owner of /bin in a user-namespaced pod: %q, %v; want 0 (the rootfs idmapped)", out, err)
	}
}
