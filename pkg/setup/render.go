package setup

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/containerd/platforms"

	"github.com/cklite/cklite/pkg/config"
)

// Runtime is the runtime type of cklite's shim.
const Runtime = "io.containerd.cklite.v2"

// Snapshotter is the name containerd's configuration gives cklite-snapshotter, and its
// differ's name.
const (
	Snapshotter = "cklite"
	Differ      = "cklite-diff"
)

// PauseImage is the CRI sandbox image a private instance pins: `cklite image build pause` makes
// it, without a registry.
const PauseImage = "localhost/cklite/pause:latest"

// DefaultContainerdAddress is the socket of the host's containerd, the one an existing instance
// is assumed to be.
const DefaultContainerdAddress = config.DefaultContainerdAddress

// Options says what instance to write.
type Options struct {
	// Root holds everything cklite writes: an absolute path.
	Root string
	// Existing says a containerd already runs at Address: cklite adds what it imports, not a
	// configuration of its own.
	Existing bool
	// Address is containerd's socket. Default: Root/run/containerd.sock for a private containerd,
	// DefaultContainerdAddress for an existing one.
	Address string
	// CNIBin holds the CNI plugins nerdctl's networks and CRI's pods use.
	CNIBin string
	// Subnet is the private instance's default network (FreeSubnet chooses one).
	Subnet string
	// Platform is what images unpack for (default: this host's).
	Platform string
}

// File is one file of an instance's configuration.
type File struct {
	Path    string
	Content string
	Mode    uint32
}

// complete checks o and fills in its defaults.
func (o Options) complete() (Options, error) {
	if !filepath.IsAbs(o.Root) {
		return o, fmt.Errorf("root %q: want an absolute path", o.Root)
	}
	o.Root = filepath.Clean(o.Root)
	l := Layout{o.Root}
	if o.Address == "" {
		o.Address = l.ContainerdAddress()
		if o.Existing {
			o.Address = DefaultContainerdAddress
		}
	}
	o.Address = strings.TrimPrefix(o.Address, "unix://")
	if !filepath.IsAbs(o.Address) {
		return o, fmt.Errorf("containerd address %q: want an absolute socket path", o.Address)
	}
	if o.Platform == "" {
		o.Platform = platforms.DefaultString()
	}
	for _, p := range []string{o.Root, o.Address, o.CNIBin, o.Platform} {
		if strings.ContainsFunc(p, func(r rune) bool { return !unicode.IsPrint(r) || r == '\'' || r == '"' || r == '\\' }) {
			return o, fmt.Errorf("%q: quotes, backslashes and unprintable characters are not taken in paths here", p)
		}
	}
	if o.CNIBin == "" {
		return o, errors.New("no CNI plugin directory given")
	}
	if o.Subnet == "" && !o.Existing {
		return o, errors.New("no subnet given for the instance's network")
	}
	for _, sock := range []string{o.Address + ".ttrpc", l.SnapshotterAddress()} {
		if err := checkSocket(sock); err != nil {
			return o, err
		}
	}
	return o, nil
}

// Render returns the files of the instance o describes, in the order they are best read.
func Render(o Options) ([]File, error) {
	o, err := o.complete()
	if err != nil {
		return nil, err
	}
	l := Layout{o.Root}
	var files []File
	if !o.Existing {
		files = append(files, File{Path: l.ContainerdConfig(), Content: containerdConfig(o), Mode: 0o644})
	}
	files = append(files,
		File{Path: l.CkliteSnippet(), Content: ckliteSnippet(o), Mode: 0o644},
		File{Path: l.SnapshotterConfig(), Content: snapshotterConfig(o), Mode: 0o644})
	if !o.Existing {
		network, err := networkConfig(o)
		if err != nil {
			return nil, err
		}
		files = append(files,
			File{Path: l.ShimConfig(), Content: shimConfig(o), Mode: 0o644},
			File{Path: l.NetworkConfig(), Content: network, Mode: 0o644})
	}
	files = append(files,
		File{Path: l.NerdctlConfig(), Content: nerdctlConfig(o), Mode: 0o644},
		File{Path: l.Env(), Content: envFile(o), Mode: 0o644})
	return files, nil
}

// containerdConfig is a private containerd's configuration: its own root, state and sockets, CRI
// pods on the instance's CNI configuration, and the cklite snippet imported.
func containerdConfig(o Options) string {
	l := Layout{o.Root}
	return fmt.Sprintf(`# containerd's configuration of the private cklite instance in %[1]s, written by
# cklite setup. cklite daemon start starts it as:
#   CKLITE_SHIM_CONFIG=%[9]s containerd --config THIS-FILE
# with containerd-shim-cklite-v2 and criu on its PATH.
version = 3
root = %[2]q
state = %[3]q
temp = %[4]q
# cklite's shim, snapshotter and differ.
imports = [%[5]q]

[grpc]
  address = %[6]q

[ttrpc]
  address = %[7]q

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      # Pods need no registry: cklite image build pause makes it.
      sandbox = %[8]q
  [plugins.'io.containerd.cri.v1.runtime']
    # Pod network namespaces under the state directory, released with it.
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%[10]q]
      conf_dir = %[11]q
`, o.Root, l.ContainerdRoot(), l.ContainerdState(), l.Temp(), l.CkliteSnippet(), o.Address, o.Address+".ttrpc",
		PauseImage, l.ShimConfig(), o.CNIBin, l.CNIConfDir())
}

// ckliteSnippet registers cklite in a containerd: cklite-snapshotter as the proxy snapshotter
// "cklite" and its differ "cklite-diff", image unpacking into cklite, and the CRI runtime handler
// "cklite".
func ckliteSnippet(o Options) string {
	l := Layout{o.Root}
	return fmt.Sprintf(`# What registers cklite in a containerd (configuration version 3), written by cklite setup:
# a containerd imports it (imports = [%[1]q] in its
# configuration) and then needs cklite-snapshotter serving %[2]s
# whenever it runs: with cklite-diff first in the diff order, a dead socket fails every unpack.
version = 3

[proxy_plugins]
  [proxy_plugins.%[3]s]
    type = "snapshot"
    address = %[2]q
  [proxy_plugins.%[4]s]
    type = "diff"
    address = %[2]q

[plugins]
  # cklite-diff diffs cklite snapshots (every checkpoint with --rw does) from their upper directory
  # alone and hands any other diff on to walking.
  [plugins.'io.containerd.service.v1.diff-service']
    default = [%[4]q, 'walking']

  # ctr images import and ctr pull unpack only into the snapshotters listed here.
  [plugins.'io.containerd.transfer.v1.local']
    [[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
      platform = %[5]q
      snapshotter = %[3]q
      differ = 'walking'
    [[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
      platform = %[5]q
      snapshotter = 'overlayfs'
      differ = 'walking'

  [plugins.'io.containerd.cri.v1.runtime']
    # The kubelet's checkpoint API needs it.
    enable_criu = true
    # RuntimeClass handler cklite. No options table: see contrib/kubernetes/containerd-cri.toml.
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.cklite]
      runtime_type = %[6]q
      snapshotter = %[3]q
      pod_annotations = ['cklite.io/*']
`, l.CkliteSnippet(), l.SnapshotterAddress(), Snapshotter, Differ, o.Platform, Runtime)
}

func snapshotterConfig(o Options) string {
	l := Layout{o.Root}
	return fmt.Sprintf(`# cklite-snapshotter's configuration, written by cklite setup: cklite daemon start runs
#   cklite-snapshotter --config THIS-FILE
# Keys: docs/configuration.md.
address = %q
root = %q
containerd_address = %q
log_level = "info"
`, l.SnapshotterAddress(), l.SnapshotterRoot(), o.Address)
}

func shimConfig(o Options) string {
	return fmt.Sprintf(`# The configuration of containerd-shim-cklite-v2 and of the cklite CLI, written by cklite setup.
# Both find it through CKLITE_SHIM_CONFIG (cklite daemon start gives it to containerd, whose shims
# inherit it; . %s gives it to your shell). Keys: docs/configuration.md.
state_dir = %q
`, Layout{o.Root}.Env(), Layout{o.Root}.StateDir())
}

// nerdctlConfig makes cklite nerdctl's snapshotter, so that images unpack into it at pull and load
// and containers run on it without --snapshotter. nerdctl has no setting for a default runtime:
// --runtime io.containerd.cklite.v2 stays on run and create.
func nerdctlConfig(o Options) string {
	l := Layout{o.Root}
	var b strings.Builder
	fmt.Fprintf(&b, `# nerdctl's configuration for cklite, written by cklite setup; . %s sets NERDCTL_TOML to it.
address = %q
snapshotter = %q
# The cklite shim drives cgroups through cgroupfs only.
cgroup_manager = "cgroupfs"
`, l.Env(), o.Address, Snapshotter)
	if !o.Existing {
		// A private containerd gets nerdctl state of its own: names, logs, networks.
		fmt.Fprintf(&b, "data_root = %q\ncni_path = %q\ncni_netconfpath = %q\n", l.NerdctlDataRoot(), o.CNIBin, l.CNIConfDir())
	}
	return b.String()
}

// envFile is what a shell sources to drive the instance with ctr, nerdctl and cklite.
func envFile(o Options) string {
	l := Layout{o.Root}
	vars := [][2]string{
		{"CKLITE_ROOT", o.Root},
		{"CONTAINERD_ADDRESS", o.Address},
		{"CONTAINERD_SNAPSHOTTER", Snapshotter},
		{"NERDCTL_TOML", l.NerdctlConfig()},
	}
	if !o.Existing {
		vars = append(vars, [2]string{config.ShimConfigEnv, l.ShimConfig()})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# . %s: ctr, nerdctl and cklite in this shell drive the cklite instance in %s.\n", l.Env(), o.Root)
	for _, v := range vars {
		fmt.Fprintf(&b, "export %s='%s'\n", v[0], v[1])
	}
	return b.String()
}
