package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/cklite/cklite/pkg/localimage"
)

// containerdConfig renders the daemon's config (version 3, which containerd 2.x migrates on load).
// The cklite runtime handler for CRI is always present, the cklite proxy snapshotter only when it
// runs; CRI's sandbox image is the locally built pause image (Daemon.CRI imports it); for ctr, nerdctl and the Go client the runtime name io.containerd.cklite.v2 resolves to the
// shim binary on the daemon's PATH, so nothing else is needed to register it.
func (d *Daemon) containerdConfig() string {
	level := d.cfg.LogLevel
	if level == "" {
		level = "info"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `version = 3
root = %q
state = %q
temp = %q
imports = [%s]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  level = %q

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = %q
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %q

  [plugins.'io.containerd.cri.v1.runtime']
    enable_criu = true
    # These VMs deny CAP_SYS_RESOURCE even to root, so a pod sandbox's oom_score_adj (-998)
    # cannot be set: clamp it to containerd's own.
    restrict_oom_score_adj = true
    # Pod network namespaces under the daemon's state, not /var/run/netns: a pod a test leaves
    # behind is then released with the daemon's directory instead of outliving the run.
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%q]
      conf_dir = %q
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.cklite]
      runtime_type = %q
      pod_annotations = ['cklite.io/*']
`, d.Root, d.State, filepath.Join(d.Dir, "tmp"), quoteList(d.cfg.Imports), d.Address, d.Address+".ttrpc", level,
		d.HostsDir, localimage.PauseName, d.stack.CNIBin, filepath.Join(d.Dir, "cni", "net.d"), CkliteRuntime)
	if d.SnapshotterAddress != "" {
		b.WriteString("      snapshotter = 'cklite'\n")
	}
	// What contrib/kubernetes/containerd-cri.toml sets: the shim gets it as runtimeoptions.
	b.WriteString(`      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.cklite.options]
        SystemdCgroup = false
`)
	if d.SnapshotterAddress != "" {
		// The transfer service (ctr pull, ctr images import) unpacks only into the snapshotters
		// its unpack_config lists; naming cklite replaces the default list, so overlayfs is
		// listed again.
		fmt.Fprintf(&b, `
  [plugins.'io.containerd.transfer.v1.local']
    [[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
      platform = 'linux/%[2]s'
      snapshotter = 'overlayfs'
      differ = 'walking'
    [[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
      platform = 'linux/%[2]s'
      snapshotter = 'cklite'
      differ = 'walking'

  [plugins.'io.containerd.service.v1.diff-service']
    default = ['cklite-diff', 'walking']

[proxy_plugins]
  [proxy_plugins.cklite]
    type = 'snapshot'
    address = %[1]q
  [proxy_plugins.cklite-diff]
    type = 'diff'
    address = %[1]q
`, d.SnapshotterAddress, runtime.GOARCH)
	}
	return b.String()
}

// quoteList is a TOML array's elements.
func quoteList(items []string) string {
	quoted := make([]string, len(items))
	for i, item := range items {
		quoted[i] = strconv.Quote(item)
	}
	return strings.Join(quoted, ", ")
}

func (d *Daemon) shimConfigPath() string { return filepath.Join(d.Dir, "shim.toml") }

// shimConfig is the cklite shim's configuration, which the CLI reads too: the daemon's state
// directory.
func (d *Daemon) shimConfig() string { return fmt.Sprintf("state_dir = %q\n", d.StateDir) }

// SetShimConfig rewrites the shim's configuration as the daemon's plus extra (TOML lines): the
// shims read it on every restore, so it applies from the next one.
func (d *Daemon) SetShimConfig(extra string) error {
	return os.WriteFile(d.shimConfigPath(), []byte(d.shimConfig()+extra), 0o644)
}

func (d *Daemon) nerdctlConfigPath() string { return filepath.Join(d.Dir, "nerdctl.toml") }

// nerdctlConfig points nerdctl at this daemon, with its own data root (container names, logs,
// checkpoints) and CNI configuration, so it shares nothing with a nerdctl on the host.
func (d *Daemon) nerdctlConfig() string {
	return fmt.Sprintf(`address = %q
namespace = %q
snapshotter = "overlayfs"
cgroup_manager = "cgroupfs"
data_root = %q
cni_path = %q
cni_netconfpath = %q
hosts_dir = [%q]
`, d.Address, d.Namespace, filepath.Join(d.Dir, "nerdctl"), d.stack.CNIBin, filepath.Join(d.Dir, "cni", "net.d"), d.HostsDir)
}
