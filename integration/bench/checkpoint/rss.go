package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/cklite/cklite/integration/shimproc"
)

// shimPeak is the peak resident memory (VmHWM, bytes) of the shim serving container id, 0 when
// none is found.
func (e *env) shimPeak(id string) uint64 {
	var peak uint64
	for _, pid := range shimproc.Find(e.d.Address, id) {
		if m, err := shimproc.ReadMemory(pid); err == nil {
			peak = max(peak, m.Peak)
		}
	}
	return peak
}

// snapshotterPID is the pid of the cklite-snapshotter serving this benchmark's daemon (the one
// listening on its socket), 0 when none is found.
func (e *env) snapshotterPID() int {
	if e.snapPID != 0 {
		return e.snapPID
	}
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(data), "\x00")
		if i := slices.Index(args, "--address"); i >= 0 && i+1 < len(args) && args[i+1] == e.d.SnapshotterAddress {
			e.snapPID = pid
			return pid
		}
	}
	return 0
}

// resetSnapshotterPeak starts a new high-water mark of cklite-snapshotter's resident memory
// (clear_refs 5 resets VmHWM), so that each workload reports its own peak: the snapshotter runs
// for the whole benchmark.
func (e *env) resetSnapshotterPeak() {
	if pid := e.snapshotterPID(); pid != 0 {
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
	}
}

// snapshotterPeak is cklite-snapshotter's peak resident memory (bytes) since the last reset.
func (e *env) snapshotterPeak() uint64 {
	m, err := shimproc.ReadMemory(e.snapshotterPID())
	if err != nil {
		return 0
	}
	return m.Peak
}
