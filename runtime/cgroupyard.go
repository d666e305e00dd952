package runtime

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// hostCgroupYard is where a cgroup v1 host mounts each hierarchy in its own directory.
const hostCgroupYard = "/sys/fs/cgroup"

// cgroupYardOption is the CRIU option that has a dump open the container's cgroup hierarchies
// in the host's mounts, when they form a yard CRIU can use: otherwise CRIU mounts each hierarchy
// afresh on every dump (fsopen and fsmount per controller, 5-16 ms a dump on this cgroup v1 host
// under load, 0.1 ms through the yard). The cgroup image is the same either way: the same
// hierarchies, walked from the same roots. "" when the yard does not fit (cgroup v2 alone, a
// hierarchy mounted elsewhere or from a subtree); the dump then mounts as before.
func cgroupYardOption(initPid int) string {
	cgroups, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", initPid))
	if err != nil {
		return ""
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	if !cgroupYardFits(cgroups, mountinfo, hostCgroupYard) {
		return ""
	}
	return "cgroup-yard " + hostCgroupYard
}

// cgroupYardFits reports whether yard holds, the way CRIU's --cgroup-yard expects (criu/cgroup.c,
// collect_cgroups), every hierarchy a process with cgroups (/proc/PID/cgroup) is in: a directory
// named after the hierarchy ("name=X" as X, the v2 one as "unified", else its controllers as
// listed), on which that hierarchy is mounted from its root, as mountinfo shows the mounts.
func cgroupYardFits(cgroups, mountinfo []byte, yard string) bool {
	mounts := mountsByPoint(mountinfo)
	n := 0
	s := bufio.NewScanner(bytes.NewReader(cgroups))
	for s.Scan() {
		fields := strings.SplitN(s.Text(), ":", 3)
		if len(fields) != 3 {
			return false
		}
		dir, fstype, want := yardDir(fields[1])
		m, ok := mounts[filepath.Join(yard, dir)]
		if !ok || m.root != "/" || m.fstype != fstype {
			return false
		}
		for _, opt := range want {
			if !slices.Contains(m.superOpts, opt) {
				return false
			}
		}
		n++
	}
	return n > 0 && s.Err() == nil
}

// yardDir is the directory CRIU opens in a yard for the hierarchy named controllers in
// /proc/PID/cgroup, the type of filesystem mounted there and the super options it must show.
func yardDir(controllers string) (dir, fstype string, superOpts []string) {
	switch {
	case controllers == "":
		return "unified", "cgroup2", nil
	case strings.HasPrefix(controllers, "name="):
		return strings.TrimPrefix(controllers, "name="), "cgroup", []string{controllers}
	}
	return controllers, "cgroup", strings.Split(controllers, ",")
}

// mountPoint is what a mountinfo line says of a mount.
type mountPoint struct {
	root, fstype string
	superOpts    []string
}

// mountsByPoint are the mounts of mountinfo by mount point, the last one mounted on a
// point (the one visible there) winning.
func mountsByPoint(mountinfo []byte) map[string]mountPoint {
	mounts := map[string]mountPoint{}
	s := bufio.NewScanner(bytes.NewReader(mountinfo))
	for s.Scan() {
		pre, post, ok := strings.Cut(s.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 {
			continue
		}
		mounts[fields[4]] = mountPoint{root: fields[3], fstype: tail[0], superOpts: strings.Split(tail[2], ",")}
	}
	return mounts
}
