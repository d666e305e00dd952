package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cklite/cklite/pkg/localimage"
)

// CRINamespace is the containerd namespace the CRI plugin keeps its pods, containers and images in.
const CRINamespace = "k8s.io"

// The daemon's CRI runtime handlers (a RuntimeClass's handler): containerd's default runc, and
// cklite, on cklite-snapshotter when the daemon runs it (Config.CkliteSnapshotter).
const (
	HandlerRunc   = "runc"
	HandlerCklite = "cklite"
)

// CRI is a client of the daemon's CRI plugin, speaking k8s.io/cri-api v1 over containerd's socket
// as the kubelet does.
type CRI struct {
	Runtime runtimeapi.RuntimeServiceClient
	Images  runtimeapi.ImageServiceClient

	d    *Daemon
	conn *grpc.ClientConn
}

// CRI imports the pause image (the sandbox image of the daemon's CRI configuration) into
// CRINamespace, building it first if needed, and connects to the CRI plugin. Close it when done.
func (d *Daemon) CRI(ctx context.Context) (*CRI, error) {
	pause, err := localimage.Pause(ctx, localimage.CacheDir(), os.Stderr)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("unix://"+d.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connecting to CRI at %s: %w", d.Address, err)
	}
	c := &CRI{Runtime: runtimeapi.NewRuntimeServiceClient(conn), Images: runtimeapi.NewImageServiceClient(conn), d: d, conn: conn}
	if err := c.ImportImage(ctx, pause); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// Context returns ctx in CRINamespace, for containerd Go client calls on CRI's pods, containers and
// images.
func (c *CRI) Context(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, CRINamespace)
}

// RootfsPath is where the shim mounts the root filesystem of CRI container id, visible from the
// host (see Daemon.RootfsPath).
func (c *CRI) RootfsPath(id string) string { return c.d.rootfsPath(CRINamespace, id) }

// Cklite runs the project's cklite CLI against the daemon in CRINamespace and returns its standard
// output.
func (c *CRI) Cklite(ctx context.Context, args ...string) (string, error) {
	return c.d.cklite(ctx, CRINamespace, args...)
}

// Close closes the connection; pods and containers stay (the daemon's Close removes them).
func (c *CRI) Close() error { return c.conn.Close() }

// ImportImage imports a locally built image into CRINamespace and waits until the CRI plugin
// lists it under its name (the plugin learns of images from containerd's events).
func (c *CRI) ImportImage(ctx context.Context, img localimage.Image) error {
	if _, err := c.d.run(ctx, "ctr", "--address", c.d.Address, "--namespace", CRINamespace, "images", "import", "--no-unpack", img.Archive); err != nil {
		return err
	}
	return c.d.ctrd.waitReady(10*time.Second, func() error {
		st, err := c.Images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img.Name}})
		if err == nil && st.GetImage() == nil {
			err = fmt.Errorf("CRI does not list %s after its import", img.Name)
		}
		return err
	})
}

// UseBridge gives pods that are not on the host's network a CNI bridge network: a bridge device
// named bridge (at most 15 characters) on subnet (CIDR), addresses from host-local IPAM kept in
// the daemon's directory, no masquerading or firewall rules to undo. It waits until CRI reports its
// network ready. The bridge device outlives the pods (CNI leaves it): the returned func deletes it.
func (c *CRI) UseBridge(ctx context.Context, bridge, subnet string) (func() error, error) {
	return c.useBridge(ctx, bridge, subnet, "")
}

// UseBridgeWithPorts is UseBridge with CNI's portmap plugin after the bridge, for pods that map
// host ports (critest's port mapping cases): it adds host iptables rules for a pod's ports, which
// it removes when CRI stops the pod.
func (c *CRI) UseBridgeWithPorts(ctx context.Context, bridge, subnet string) (func() error, error) {
	return c.useBridge(ctx, bridge, subnet, `, {"type": "portmap", "capabilities": {"portMappings": true}}`)
}

// useBridge is UseBridge with more plugins (JSON objects, each after a comma) chained after the
// bridge.
func (c *CRI) useBridge(ctx context.Context, bridge, subnet, more string) (func() error, error) {
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": %q, "plugins": [{"type": "bridge", "bridge": %q, "isGateway": true,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}}%s]}`,
		bridge, bridge, subnet, filepath.Join(c.d.Dir, "cni", "ipam"), more)
	// CRI loads the first network of its conf_dir by name, where nerdctl keeps its networks too.
	path := filepath.Join(c.d.Dir, "cni", "net.d", "10-"+bridge+".conflist")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	remove := func() error {
		out, err := exec.Command("ip", "link", "delete", bridge).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "Cannot find device") {
			return fmt.Errorf("deleting bridge %s: %w: %s", bridge, err, out)
		}
		return nil
	}
	return remove, c.d.ctrd.waitReady(10*time.Second, func() error {
		st, err := c.Runtime.Status(ctx, &runtimeapi.StatusRequest{})
		if err != nil {
			return err
		}
		for _, cond := range st.GetStatus().GetConditions() {
			if cond.GetType() == runtimeapi.NetworkReady && cond.GetStatus() {
				return nil
			}
		}
		return fmt.Errorf("CRI's network is not ready after writing %s: %v", path, st.GetStatus().GetConditions())
	})
}

// Pod is a pod sandbox the CRI plugin runs.
type Pod struct {
	ID     string
	Config *runtimeapi.PodSandboxConfig
}

// RunPod runs a pod sandbox named name with the runtime handler, configured as PodConfig says.
func (c *CRI) RunPod(ctx context.Context, name, handler string, hostNetwork bool) (*Pod, error) {
	cfg, err := c.PodConfig(name, hostNetwork)
	if err != nil {
		return nil, err
	}
	return c.RunPodConfig(ctx, cfg, handler)
}

// PodConfig returns the config of a pod sandbox named name, for callers that change it before
// RunPodConfig (annotations, say). hostNetwork puts the pod in the host's network namespace, which
// needs no CNI; otherwise CNI configures its own namespace (see UseBridge). Its cgroups go below
// /<daemon namespace>, which the daemon's teardown removes, not below CRI's default /k8s.io, which
// every daemon on the host would share.
func (c *CRI) PodConfig(name string, hostNetwork bool) (*runtimeapi.PodSandboxConfig, error) {
	// A pod on the host's network shares its UTS namespace too, where no hostname may be set.
	netMode, hostname := runtimeapi.NamespaceMode_POD, name
	if hostNetwork {
		netMode, hostname = runtimeapi.NamespaceMode_NODE, ""
	}
	logDir := filepath.Join(c.d.Dir, "pods", name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: randomHex(8)},
		Hostname:     hostname,
		LogDirectory: logDir,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: "/" + c.d.Namespace,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: netMode, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD},
			},
		},
	}, nil
}

// RunPodConfig runs the pod sandbox cfg with the runtime handler.
func (c *CRI) RunPodConfig(ctx context.Context, cfg *runtimeapi.PodSandboxConfig, handler string) (*Pod, error) {
	resp, err := c.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		return nil, fmt.Errorf("running pod %s with handler %q: %w", cfg.GetMetadata().GetName(), handler, err)
	}
	return &Pod{ID: resp.GetPodSandboxId(), Config: cfg}, nil
}

// Container returns the config of a container named name in the pod, running args (the image's
// entrypoint and command when none) from image, logging to name.log in the pod's log directory.
// Callers may change it before StartContainer.
func (p *Pod) Container(name, image string, args ...string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: image},
		Command:  args,
		LogPath:  name + ".log",
		Linux: &runtimeapi.LinuxContainerConfig{
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
				NamespaceOptions: p.Config.GetLinux().GetSecurityContext().GetNamespaceOptions(),
			},
		},
	}
}

// StartContainer creates the container cfg in the pod and starts it, as the kubelet does, and
// returns its id.
func (c *CRI) StartContainer(ctx context.Context, pod *Pod, cfg *runtimeapi.ContainerConfig) (string, error) {
	created, err := c.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.ID, Config: cfg, SandboxConfig: pod.Config})
	if err != nil {
		return "", fmt.Errorf("creating container %s: %w", cfg.GetMetadata().GetName(), err)
	}
	id := created.GetContainerId()
	if _, err := c.Runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		return id, fmt.Errorf("starting container %s: %w", cfg.GetMetadata().GetName(), err)
	}
	return id, nil
}

// Exec runs cmd in container id with ExecSync and returns its stdout; a non-zero exit is an error
// quoting stderr.
func (c *CRI) Exec(ctx context.Context, id string, cmd ...string) (string, error) {
	resp, err := c.Runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 60})
	if err != nil {
		return "", fmt.Errorf("exec %q in %s: %w", cmd, id, err)
	}
	if resp.GetExitCode() != 0 {
		return string(resp.GetStdout()), fmt.Errorf("exec %q in %s: exit code %d: %s", cmd, id, resp.GetExitCode(), strings.TrimSpace(string(resp.GetStderr())))
	}
	return string(resp.GetStdout()), nil
}

// ContainerState returns the CRI state of container id.
func (c *CRI) ContainerState(ctx context.Context, id string) (runtimeapi.ContainerState, error) {
	st, err := c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return runtimeapi.ContainerState_CONTAINER_UNKNOWN, fmt.Errorf("status of container %s: %w", id, err)
	}
	return st.GetStatus().GetState(), nil
}

// WaitContainerState waits up to timeout until container id is in state.
func (c *CRI) WaitContainerState(ctx context.Context, id string, state runtimeapi.ContainerState, timeout time.Duration) error {
	return c.d.ctrd.waitReady(timeout, func() error {
		got, err := c.ContainerState(ctx, id)
		if err == nil && got != state {
			err = fmt.Errorf("container %s is %v, waiting for %v", id, got, state)
		}
		return err
	})
}

// RemovePod stops the pod and removes it with its containers, as the kubelet does when a pod is
// deleted.
func (c *CRI) RemovePod(ctx context.Context, pod *Pod) error {
	if _, err := c.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod.ID}); err != nil {
		return fmt.Errorf("stopping pod %s: %w", pod.Config.GetMetadata().GetName(), err)
	}
	if _, err := c.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod.ID}); err != nil {
		return fmt.Errorf("removing pod %s: %w", pod.Config.GetMetadata().GetName(), err)
	}
	return nil
}

// RemovePods stops and removes every pod the CRI plugin has, as RemovePod does: a client that
// creates pods of its own (critest) may leave some behind, whose CNI addresses and host port rules
// only stopping them through CRI releases.
func (c *CRI) RemovePods(ctx context.Context) error {
	pods, err := c.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	var errs []error
	for _, p := range pods.GetItems() {
		errs = append(errs, c.RemovePod(ctx, &Pod{ID: p.GetId(), Config: &runtimeapi.PodSandboxConfig{Metadata: p.GetMetadata()}}))
	}
	return errors.Join(errs...)
}
