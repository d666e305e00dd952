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
)

// nerdctlName is the label holding the name nerdctl shows for a container; its id is a 64-digit
// hex string nobody types.
const nerdctlName = "nerdctl/name"

// DefaultPrefix is the prefix of the forks of c's checkpoints: its nerdctl name, or else its id,
// then "-fork".
func DefaultPrefix(c containers.Container) string {
	if name := c.Labels[nerdctlName]; name != "" {
		return name + "-fork"
	}
	return c.ID + "-fork"
}

// Names are the container ids of n forks: prefix-1 ... prefix-n. An id containerd would refuse
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

// specFor is the runtime spec of fork id, made from the original container's spec (its JSON,
// decoded afresh for every fork so that no fork shares a slice or map with another):
//
//   - the cgroup is the fork's own: the last element of cgroupsPath becomes id, so the fork is
//     limited like the original but never counted with it (a restore into the original's cgroup
//     while the original runs is what makes a stock restore fail as a second container);
//   - the network namespace is new: a path to the original's (or its pod's) namespace is dropped.
//     CRIU restores the processes, not the network devices, into it;
//   - the hooks are dropped. In containerd's flows they are the CNI setup nerdctl installs
//     (`nerdctl internal oci-hook`), which reads the original's network identity (name, IPs,
//     ports, MAC, state directory) from the spec's annotations: run again for a fork they would
//     claim the original's addresses. A fork therefore has loopback only, down, as after any
//     CRIU restore into a new namespace;
//   - the hostname stays: the restored processes already know it.
func specFor(original []byte, id string) (*oci.Spec, error) {
	var s oci.Spec
	if err := json.Unmarshal(original, &s); err != nil {
		return nil, fmt.Errorf("spec of the original container: %w", err)
	}
	s.Hooks = nil
	if s.Linux != nil {
		s.Linux.CgroupsPath = forkCgroupsPath(s.Linux.CgroupsPath, id)
		for i, ns := range s.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace {
				s.Linux.Namespaces[i].Path = ""
			}
		}
	}
	return &s, nil
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

// labelsFor is the labels of a fork: the original's, minus those by which nerdctl manages the
// original. nerdctl acts on them: `nerdctl rm` of a container carrying the original's
// nerdctl/state-dir, nerdctl/name or nerdctl/anonymous-volumes would delete the original's state
// directory (its hosts and resolv.conf), free its name or remove its volumes, and nerdctl compose
// would count the fork as a replica of the original's service. Without them nerdctl lists, stops
// and removes a fork as a container it did not create, by id.
func labelsFor(original map[string]string) map[string]string {
	labels := maps.Clone(original)
	maps.DeleteFunc(labels, func(k, _ string) bool {
		return strings.HasPrefix(k, "nerdctl/") || strings.HasPrefix(k, "com.docker.compose.")
	})
	return labels
}
