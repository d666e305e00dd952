package criuimage

import (
	"fmt"
	"path/filepath"

	securejoin "github.com/cyphar/filepath-securejoin"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// kernelFS are the file systems a container's mount namespace holds that show nothing of the
// host's files: CRIU mounts them afresh. Any other file system (a disk's, overlay, devtmpfs) in
// an image is a mount of host files unless it is the rootfs, a bind mount the spec gives
// (external: CRIU takes its source from the runtime, not the image) or a bind from the rootfs.
var kernelFS = map[uint32]bool{fsProc: true, fsSysfs: true, fsTmpfs: true, fsDevpts: true, fsCgroup: true, fsMqueue: true, fsCgroup2: true}

// runtimeMounts are where libcontainer itself mounts: the console and, for masked paths, /dev/null.
var runtimeMounts = []string{"/dev/console", "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}

// checkMounts refuses a mount the container's spec does not give: every mount of the image must
// be the rootfs, at a spec mount's destination, at a masked or read-only path, or a kernel file
// system under a spec mount (cgroup hierarchies under /sys/fs/cgroup, say); an external (bind)
// mount must be one of the spec's; any other file system must come from the rootfs.
func checkMounts(mounts []Mount, spec *specs.Spec, rootfs string) error {
	if len(mounts) == 0 {
		return nil
	}
	ids := map[uint32]Mount{}
	for _, m := range mounts {
		ids[m.ID] = m
	}
	var root *Mount
	for i, m := range mounts {
		if _, ok := ids[m.Parent]; !ok {
			if root != nil {
				return fmt.Errorf("two root mounts (%s and %s)", root.Mountpoint, m.Mountpoint)
			}
			root = &mounts[i]
		}
	}
	if root == nil || root.Mountpoint != "/" {
		return fmt.Errorf("the image's mount tree has no root at /")
	}
	dests, binds, cgroups := specMounts(spec, rootfs)
	for _, m := range mounts {
		if m.ID == root.ID {
			continue
		}
		if err := checkMount(m, root, dests, binds, cgroups); err != nil {
			return fmt.Errorf("mount %s (%s %s): %w", m.Mountpoint, fsName(m), m.Source, err)
		}
	}
	return nil
}

func checkMount(m Mount, root *Mount, dests, binds, cgroups map[string]bool) error {
	at := dests[m.Mountpoint]
	// A tmpfs holds only what the image brings, which the restored processes get anyway: the
	// Go client's spec mounts one at /run where nerdctl's does not.
	fresh := m.FSType == fsTmpfs && !m.External && m.ExtKey == ""
	if !at && !under(m.Mountpoint, dests) && !fresh {
		return fmt.Errorf("not a mount of the container's spec")
	}
	if m.External || m.ExtKey != "" {
		// CRIU takes an external mount's source from the runtime's map of keys (libcontainer's:
		// the spec's bind mounts by destination, and /dev/null over masked paths), not from
		// the image.
		key := m.ExtKey
		if key == "" {
			key = m.Mountpoint
		}
		key = cleanMountpoint(key)
		// /dev/null over a path only hides it (libcontainer masks paths so): a checkpoint taken
		// under a spec that masked more (the Go client's /proc/interrupts) stays admissible.
		// On cgroup v1 libcontainer mounts each hierarchy below the spec's cgroup mount as an
		// external bind of the host's cgroup directory, keyed by its destination.
		cgroupV1 := m.FSType == fsCgroup && key == m.Mountpoint && under(key, cgroups)
		if !binds[key] && key != "/dev/null" && !cgroupV1 {
			return fmt.Errorf("external mount %q is not a bind mount of the spec", key)
		}
		return nil
	}
	if kernelFS[m.FSType] {
		return nil
	}
	if m.RootDev == root.RootDev {
		return nil // a bind from the rootfs
	}
	return fmt.Errorf("a %s file system of the host, which the spec does not mount", fsName(m))
}

// specMounts are the destinations where the spec (or libcontainer for it) mounts, those of its
// bind mounts (masked and read-only paths count as destinations), and those of its cgroup mounts.
// With a rootfs, each mount's destination counts also as resolved in it (ResolveIn).
func specMounts(spec *specs.Spec, rootfs string) (dests, binds, cgroups map[string]bool) {
	dests, binds, cgroups = map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, m := range spec.Mounts {
		for _, d := range destinations(m.Destination, rootfs) {
			dests[d] = true
			if m.Type == "bind" || hasBind(m.Options) {
				binds[d] = true
			}
			if m.Type == "cgroup" {
				cgroups[d] = true
			}
		}
	}
	for _, d := range runtimeMounts {
		dests[d] = true
	}
	if l := spec.Linux; l != nil {
		for _, p := range l.MaskedPaths {
			dests[cleanMountpoint(p)] = true
		}
		for _, p := range l.ReadonlyPaths {
			dests[cleanMountpoint(p)] = true
		}
	}
	return dests, binds, cgroups
}

// destinations are where a mount at dest lands: dest as written and, with a rootfs, dest with
// the rootfs's symlinks resolved inside it (securejoin, as libcontainer resolves it).
func destinations(dest, rootfs string) []string {
	d := cleanMountpoint(dest)
	if rootfs == "" {
		return []string{d}
	}
	resolved, err := securejoin.SecureJoin(rootfs, d)
	if err != nil {
		return []string{d}
	}
	rel, err := filepath.Rel(rootfs, resolved)
	if err != nil {
		return []string{d}
	}
	return []string{d, cleanMountpoint("/" + rel)}
}

func hasBind(opts []string) bool {
	for _, o := range opts {
		if o == "bind" || o == "rbind" {
			return true
		}
	}
	return false
}

// under reports whether p lies strictly below one of dirs (not "/").
func under(p string, dirs map[string]bool) bool {
	for d := filepath.Dir(p); d != "/" && d != "."; d = filepath.Dir(d) {
		if dirs[d] {
			return true
		}
	}
	return false
}

var fsNames = map[uint32]string{fsProc: "proc", fsSysfs: "sysfs", 3: "devtmpfs", 4: "binfmt_misc", fsTmpfs: "tmpfs",
	fsDevpts: "devpts", 9: "securityfs", 10: "fusectl", 11: "debugfs", fsCgroup: "cgroup", fsMqueue: "mqueue", 15: "fuse",
	17: "overlay", 18: "autofs", 19: "tracefs", fsCgroup2: "cgroup2"}

func fsName(m Mount) string {
	if m.FSName != "" {
		return m.FSName
	}
	if n, ok := fsNames[m.FSType]; ok {
		return n
	}
	if m.FSType == fsAuto {
		return "auto"
	}
	return fmt.Sprintf("fstype %d", m.FSType)
}
