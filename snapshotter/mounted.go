//go:build linux

package snapshotter

import (
	"fmt"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// mountedUpper returns where an overlay with upper directory upper is mounted, or "" if it is
// not, as seen from this process's mount namespace (the host's, where containerd's shims mount
// container root filesystems).
func mountedUpper(upper string) (string, error) {
	want := "upperdir=" + upper
	mounts, err := mountinfo.GetMounts(func(info *mountinfo.Info) (skip, stop bool) {
		if info.FSType != "overlay" {
			return true, false
		}
		for _, option := range strings.Split(info.VFSOptions, ",") {
			if option == want {
				return false, true
			}
		}
		return true, false
	})
	if err != nil {
		return "", fmt.Errorf("reading the mount table: %w", err)
	}
	if len(mounts) == 0 {
		return "", nil
	}
	return mounts[0].Mountpoint, nil
}
