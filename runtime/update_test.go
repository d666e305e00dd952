package runtime

import (
	"testing"

	"github.com/opencontainers/cgroups"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestApplyResources(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start cgroups.Resources
		in    specs.LinuxResources
		check func(*testing.T, *cgroups.Resources)
	}{
		{
			name: "memory limit",
			in:   specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: ptr[int64](1 << 20)}},
			check: func(t *testing.T, r *cgroups.Resources) {
				if r.Memory != 1<<20 {
					t.Fatal(r.Memory)
				}
			},
		},
		{
			name: "unlimited memory without swap sets swap 0",
			in:   specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: ptr[int64](-1)}},
			check: func(t *testing.T, r *cgroups.Resources) {
				if r.Memory != -1 || r.MemorySwap != 0 {
					t.Fatal(r.Memory, r.MemorySwap)
				}
			},
		},
		{
			name:  "quota alone keeps period",
			start: cgroups.Resources{CpuPeriod: 100000, CpuQuota: 1},
			in:    specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: ptr[int64](50000)}},
			check: func(t *testing.T, r *cgroups.Resources) {
				if r.CpuPeriod != 100000 || r.CpuQuota != 50000 {
					t.Fatal(r.CpuPeriod, r.CpuQuota)
				}
			},
		},
		{
			name: "shares convert to weight",
			in:   specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: ptr[uint64](1024)}},
			check: func(t *testing.T, r *cgroups.Resources) {
				if r.CpuShares != 1024 || r.CpuWeight == 0 {
					t.Fatal(r.CpuShares, r.CpuWeight)
				}
			},
		},
		{
			name:  "throttle device upserted",
			start: cgroups.Resources{BlkioThrottleReadBpsDevice: []*cgroups.ThrottleDevice{cgroups.NewThrottleDevice(8, 0, 1)}},
			in: specs.LinuxResources{BlockIO: &specs.LinuxBlockIO{ThrottleReadBpsDevice: []specs.LinuxThrottleDevice{
				{LinuxBlockIODevice: specs.LinuxBlockIODevice{Major: 8, Minor: 0}, Rate: 9},
				{LinuxBlockIODevice: specs.LinuxBlockIODevice{Major: 8, Minor: 16}, Rate: 2},
			}}},
			check: func(t *testing.T, r *cgroups.Resources) {
				d := r.BlkioThrottleReadBpsDevice
				if len(d) != 2 || d[0].Rate != 9 || d[1].Minor != 16 {
					t.Fatalf("%+v", d)
				}
			},
		},
		{
			name: "pids limit",
			in:   specs.LinuxResources{Pids: &specs.LinuxPids{Limit: ptr[int64](42)}},
			check: func(t *testing.T, r *cgroups.Resources) {
				if r.PidsLimit == nil || *r.PidsLimit != 42 {
					t.Fatal(r.PidsLimit)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.start
			ApplyResources(&r, tc.in)
			tc.check(t, &r)
		})
	}
}
