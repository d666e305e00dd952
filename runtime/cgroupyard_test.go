package runtime

import "testing"

// v1Mountinfo is this test machine's cgroup v1 layout (Firecracker VM, kernel 6.18), trimmed.
const v1Mountinfo = `25 1 0:22 / /sys rw - sysfs sysfs rw
26 25 0:23 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
27 26 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
28 26 0:25 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct
29 26 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
30 26 0:27 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd
31 26 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
`

func TestCgroupYardFits(t *testing.T) {
	v1Cgroups := "5:cpu:/ns/c\n4:cpuacct:/ns/c\n3:memory:/ns/c\n2:name=systemd:/ns/c\n0::/ns/c\n"
	for _, tc := range []struct {
		name               string
		cgroups, mountinfo string
		want               bool
	}{
		{name: "cgroup v1 yard", cgroups: v1Cgroups, mountinfo: v1Mountinfo, want: true},
		{name: "a hierarchy without a directory", cgroups: v1Cgroups + "6:pids:/ns/c\n", mountinfo: v1Mountinfo},
		{name: "combined controllers mounted under their joined name",
			cgroups:   "7:cpu,cpuacct:/ns/c\n",
			mountinfo: "40 26 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n", want: true},
		{name: "a hierarchy mounted from a subtree", cgroups: "3:memory:/c\n",
			mountinfo: "29 26 0:26 /ns /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"},
		{name: "another hierarchy mounted at the name", cgroups: "3:memory:/c\n",
			mountinfo: "29 26 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,pids\n"},
		{name: "overmounted by a tmpfs", cgroups: "3:memory:/c\n",
			mountinfo: "29 26 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n" +
				"50 29 0:40 / /sys/fs/cgroup/memory rw - tmpfs tmpfs rw\n"},
		{name: "cgroup v2 alone", cgroups: "0::/c\n",
			mountinfo: "26 25 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"},
		{name: "no cgroups", cgroups: "", mountinfo: v1Mountinfo},
		{name: "malformed cgroup line", cgroups: "memory\n", mountinfo: v1Mountinfo},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cgroupYardFits([]byte(tc.cgroups), []byte(tc.mountinfo), hostCgroupYard); got != tc.want {
				t.Fatalf("cgroupYardFits = %v, want %v", got, tc.want)
			}
		})
	}
}
