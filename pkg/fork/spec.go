package fork

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// DefaultPrefix is the prefix of the forks of c's checkpoints: its nerdctl name, or else its id,
// then "-fork".
func DefaultPrefix(c containers.Container) string {
	if name := c.Labels[nerdctlName]; name != "" {
		return name + "-fork"
	}
	return c.ID + "-fork"
}

// Names are the names of n forks: prefix-1 ... prefix-n. A name containerd would refuse as an id
// is an error before any fork is made.
func Names(prefix string, n int) ([]string, error) {
	if n < 1 {
		return nil, fmt.Errorf("%d forks: want at least one: %w", n, errdefs.ErrInvalidArgument)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i+1)
		if err := identifiers.Validate(names[i]); err != nil {
			return nil, fmt.Errorf("fork name from prefix %q: %w", prefix, err)
		}
	}
	return names, nil
}

// specFor is the runtime spec of fork f, made from the original container's spec (its JSON,
// decoded afresh for every fork so that no fork shares a slice or map with another):
//
//   - the cgroup is the fork's own: the last element of cgroupsPath becomes its id, so the fork is
//     limited like the original but never counted with it (a restore into the original's cgroup
//     while the original runs is what makes a stock restore fail as a second container);
//   - the network namespace is new: a path to the original's (or its pod's) namespace is dropped.
//     CRIU restores the processes, not the network devices, into it;
//   - without network, the hooks are dropped. In containerd's flows they are the CNI setup nerdctl
//     installs (`nerdctl internal oci-hook`): the fork then has loopback only, up. With network
//     they stay, and read the fork's identity from the annotations, rewritten as its labels
//     (name, state directory, hostname; no fixed address, MAC or ports): nerdctl's CNI setup
//     then gives the fork the original's networks and a new address, as a new container;
//   - the bind mounts of /etc files from the original's directories come from the fork's copies
//     (moved), and the hostname is the fork's.
func specFor(original []byte, f identity, moved map[string]string, annotations map[string]string, network bool) (*oci.Spec, error) {
	var s oci.Spec
	if err := json.Unmarshal(original, &s); err != nil {
		return nil, fmt.Errorf("spec of the original container: %w", err)
	}
	if !network {
		s.Hooks = nil
	}
	if f.hostname != "" && s.Hostname != "" {
		s.Hostname = f.hostname
	}
	for i, m := range s.Mounts {
		if to, ok := moved[m.Source]; ok {
			s.Mounts[i].Source = to
		}
	}
	for k := range s.Annotations {
		if strings.HasPrefix(k, nerdctlPrefix) {
			if v, ok := annotations[k]; ok {
				s.Annotations[k] = v
			} else {
				delete(s.Annotations, k)
			}
		}
	}
	if s.Linux != nil {
		s.Linux.CgroupsPath = forkCgroupsPath(s.Linux.CgroupsPath, f.id)
		for i, ns := range s.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace {
				s.Linux.Namespaces[i].Path = ""
			}
		}
	}
	return &s, nil
}

// ownUTS reports whether the spec gives the container a UTS namespace of its own, whose
// hostname a fork may set.
func ownUTS(s *oci.Spec) bool {
	if s.Linux == nil {
		return false
	}
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.UTSNamespace {
			return ns.Path == ""
		}
	}
	return false
}

// forkCgroupsPath replaces the container's own element of a cgroups path with id: the last one
// of a cgroupfs path ("/default/web"), the name of a systemd one ("system.slice:nerdctl:web").
// An empty path stays empty: the runtime then derives one from the container id.
func forkCgroupsPath(path, id string) string {
	if path == "" {
		return ""
	}
	sep := "/"
	if strings.Count(path, ":") == 2 {
		sep = ":"
	}
	i := strings.LastIndex(path, sep)
	return path[:i+1] + id
}

// labelsFor is the labels of fork f in namespace ns: the original's, minus nerdctl's and
// compose's (nerdctl acts on them: `nerdctl rm` of a container carrying the original's
// nerdctl/state-dir or nerdctl/anonymous-volumes would delete the original's state directory or
// volumes, and compose would count the fork as a replica of the original's service), plus the
// fork's own nerdctl identity: its name and namespace and, for a fork of a nerdctl container,
// its state directory, hostname, networks ("none" unless network) and the original's
// keptNerdctlLabels.
func labelsFor(original map[string]string, f identity, ns string, network bool) map[string]string {
	labels := maps.Clone(original)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.DeleteFunc(labels, func(k, _ string) bool {
		return strings.HasPrefix(k, nerdctlPrefix) || strings.HasPrefix(k, "com.docker.compose.") || k == checkpoint.LineageKey
	})
	labels[nerdctlName] = f.name
	labels[nerdctlNamespace] = ns
	if f.store == nil {
		return labels
	}
	labels[nerdctlStateDir] = f.store.stateDir(f.id)
	labels[nerdctlHostname] = f.hostname
	labels[nerdctlNetworks] = `["none"]`
	if network && original[nerdctlNetworks] != "" {
		labels[nerdctlNetworks] = original[nerdctlNetworks]
	}
	for _, k := range keptNerdctlLabels {
		if v, ok := original[k]; ok {
			labels[k] = v
		}
	}
	return labels
}
