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

// TestCRIHandlerFeatures checks what the CRI plugin learnt of each runtime handler by running its
// shim with `-info` at start-up: the cklite handler, configured with an options table as
// contrib/kubernetes/containerd-cri.toml does (so CRI passes runtimeoptions.v1.Options), must
// advertise recursive read-only mounts and user namespaces as runc's does, or CRI refuses both
// (critest's "Container Mount Readonly" and "Security Context UserNamespaces" cases). A pod then
// mounts a host directory with a submount recursively read-only on cklite: the submount must be
// read-only inside, as runc makes it. (Before the fix containerd 2.4.2 did not refuse that mount:
// its CRI plugin dereferenced the handler's missing features and the daemon crashed.)
func TestCRIHandlerFeatures(t *testing.T) {
	d, cri := startCRI(t)
	ctx := criContext(t)
	st, err := cri.Runtime.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	handlers := map[string]*runtimeapi.RuntimeHandlerFeatures{}
	for _, h := range st.GetRuntimeHandlers() {
		handlers[h.GetName()] = h.GetFeatures()
	}
	for _, name := range []string{harness.HandlerCklite, harness.HandlerRunc} {
		f := handlers[name]
		if !f.GetRecursiveReadOnlyMounts() || !f.GetUserNamespaces() {
			t.Errorf("handler %q: features %v, want recursive read-only mounts and user namespaces (all handlers: %v)", name, f, st.GetRuntimeHandlers())
		}
	}

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
