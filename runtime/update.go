package runtime

import (
	"slices"

	"github.com/opencontainers/cgroups"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ApplyResources merges OCI linux resources into a container's cgroup resources the way
// `runc update --resources -` does (runc's update.go lives in package main, so it is ported):
// unset sections keep their values, quota and period may be changed one at a time, device
// throttles are upserted.
func ApplyResources(res *cgroups.Resources, r specs.LinuxResources) {
	if r.Memory == nil {
		r.Memory = &specs.LinuxMemory{}
	}
	if r.CPU == nil {
		r.CPU = &specs.LinuxCPU{}
	}
	if r.BlockIO == nil {
		r.BlockIO = &specs.LinuxBlockIO{}
	}
	if r.Pids == nil {
		r.Pids = &specs.LinuxPids{}
	}
	if r.Memory.Limit != nil && *r.Memory.Limit == -1 && r.Memory.Swap == nil {
		// "unable to set swap limit without memory limit" otherwise.
		r.Memory.Swap = ptr[int64](0)
	}
	if r.CPU.Idle != nil && r.CPU.Shares == nil {
		r.CPU.Shares = ptr[uint64](0)
	}

	applyBlockIO(res, r.BlockIO)
	applyCPU(res, r.CPU)
	if r.Memory.Limit != nil {
		res.Memory = *r.Memory.Limit
	}
	if r.Memory.Reservation != nil {
		res.MemoryReservation = *r.Memory.Reservation
	}
	if r.Memory.Swap != nil {
		res.MemorySwap = *r.Memory.Swap
	}
	res.MemoryCheckBeforeUpdate = r.Memory.CheckBeforeUpdate != nil && *r.Memory.CheckBeforeUpdate
	res.PidsLimit = r.Pids.Limit
	res.Unified = r.Unified
}

func applyBlockIO(res *cgroups.Resources, b *specs.LinuxBlockIO) {
	if b.Weight != nil {
		res.BlkioWeight = *b.Weight
	}
	if b.LeafWeight != nil {
		res.BlkioLeafWeight = *b.LeafWeight
	}
	for _, wd := range b.WeightDevice {
		res.BlkioWeightDevice = upsertWeightDevice(res.BlkioWeightDevice, wd)
	}
	for _, t := range []struct {
		dst *[]*cgroups.ThrottleDevice
		src []specs.LinuxThrottleDevice
	}{
		{&res.BlkioThrottleReadBpsDevice, b.ThrottleReadBpsDevice},
		{&res.BlkioThrottleWriteBpsDevice, b.ThrottleWriteBpsDevice},
		{&res.BlkioThrottleReadIOPSDevice, b.ThrottleReadIOPSDevice},
		{&res.BlkioThrottleWriteIOPSDevice, b.ThrottleWriteIOPSDevice},
	} {
		for _, td := range t.src {
			*t.dst = upsertThrottleDevice(*t.dst, td)
		}
	}
}

func applyCPU(res *cgroups.Resources, c *specs.LinuxCPU) {
	var (
		p uint64
		q int64
	)
	if c.Period != nil {
		p = *c.Period
	}
	if c.Quota != nil {
		q = *c.Quota
	}
	// Quota and period set together, or one at a time keeping the other's old value.
	switch {
	case (p == 0) == (q == 0):
		res.CpuPeriod, res.CpuQuota = p, q
	case p != 0:
		res.CpuPeriod = p
	default:
		res.CpuQuota = q
	}
	res.CpuBurst = c.Burst
	if c.Shares != nil {
		res.CpuShares = *c.Shares
		res.CpuWeight = cgroups.ConvertCPUSharesToCgroupV2Value(*c.Shares)
	}
	if c.RealtimePeriod != nil {
		res.CpuRtPeriod = *c.RealtimePeriod
	}
	if c.RealtimeRuntime != nil {
		res.CpuRtRuntime = *c.RealtimeRuntime
	}
	res.CpusetCpus = c.Cpus
	res.CpusetMems = c.Mems
	res.CPUIdle = c.Idle
}

func upsertWeightDevice(devices []*cgroups.WeightDevice, wd specs.LinuxWeightDevice) []*cgroups.WeightDevice {
	// Backwards: with duplicates the last one wins.
	for i, dev := range slices.Backward(devices) {
		if dev.Major != wd.Major || dev.Minor != wd.Minor {
			continue
		}
		if wd.Weight != nil {
			devices[i].Weight = *wd.Weight
		}
		if wd.LeafWeight != nil {
			devices[i].LeafWeight = *wd.LeafWeight
		}
		return devices
	}
	var weight, leaf uint16
	if wd.Weight != nil {
		weight = *wd.Weight
	}
	if wd.LeafWeight != nil {
		leaf = *wd.LeafWeight
	}
	return append(devices, cgroups.NewWeightDevice(wd.Major, wd.Minor, weight, leaf))
}

func upsertThrottleDevice(devices []*cgroups.ThrottleDevice, td specs.LinuxThrottleDevice) []*cgroups.ThrottleDevice {
	for i, dev := range slices.Backward(devices) {
		if dev.Major == td.Major && dev.Minor == td.Minor {
			devices[i].Rate = td.Rate
			return devices
		}
	}
	return append(devices, cgroups.NewThrottleDevice(td.Major, td.Minor, td.Rate))
}

func ptr[T any](v T) *T { return &v }
