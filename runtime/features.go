package runtime

import (
	"fmt"

	"github.com/opencontainers/runc/libcontainer/capabilities"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	runcfeatures "github.com/opencontainers/runc/types/features"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-spec/specs-go/features"
)

// Features describes what the engine supports, as `runc features` does for runc (containerd
// reports it as RuntimeInfo.Features). The systemd cgroup driver is not offered.
func Features() *features.Features {
	t, f := true, false
	feat := &features.Features{
		OCIVersionMin: "1.0.0",
		OCIVersionMax: specs.Version,
		Annotations: map[string]string{
			runcfeatures.AnnotationRuncCheckpointEnabled: "true",
		},
		Hooks:        configs.KnownHookNames(),
		MountOptions: specconv.KnownMountOptions(),
		Linux: &features.Linux{
			Namespaces:   specconv.KnownNamespaces(),
			Capabilities: capabilities.KnownCapabilities(),
			Cgroup:       &features.Cgroup{V1: &t, V2: &t, Systemd: &f, SystemdUser: &f, Rdma: &t},
			Apparmor:     &features.Apparmor{Enabled: &t},
			Selinux:      &features.Selinux{Enabled: &t},
			IntelRdt:     &features.IntelRdt{Enabled: &t, Schemata: &t, Monitoring: &t},
			MemoryPolicy: &features.MemoryPolicy{
				Modes: specconv.KnownMemoryPolicyModes(),
				Flags: specconv.KnownMemoryPolicyFlags(),
			},
			MountExtensions: &features.MountExtensions{IDMap: &features.IDMap{Enabled: &t}},
			NetDevices:      &features.NetDevices{Enabled: &t},
		},
		PotentiallyUnsafeConfigAnnotations: []string{"bundle", "org.criu.config"},
	}
	if seccomp.Enabled {
		feat.Linux.Seccomp = &features.Seccomp{
			Enabled:        &t,
			Actions:        seccomp.KnownActions(),
			Operators:      seccomp.KnownOperators(),
			Archs:          seccomp.KnownArchs(),
			KnownFlags:     seccomp.KnownFlags(),
			SupportedFlags: seccomp.SupportedFlags(),
		}
		major, minor, patch := seccomp.Version()
		feat.Annotations[runcfeatures.AnnotationLibseccompVersion] = fmt.Sprintf("%d.%d.%d", major, minor, patch)
	}
	return feat
}
