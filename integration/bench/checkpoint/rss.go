package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/cklite/cklite/integration/shimproc"
)

// shimPeak is the peak resident memory (VmHWM, bytes) of the shim serving container id, 0 when
// none is found.
func (e *daemon) shimPeak(id string) uint64 {
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
func (e *daemon) snapshotterPID() int {
	if e.snapPID == 0 {
		out, _ := exec.CommandContext(e.ctx, "pgrep", "-f", "--", "cklite-snapshotter --address "+e.d.SnapshotterAddress+" ").Output()
		e.snapPID, _ = strconv.Atoi(strings.TrimSpace(string(out)))
	}
	return e.snapPID
}

// resetSnapshotterPeak starts a new high-water mark of cklite-snapshotter's resident memory
// (clear_refs 5 resets VmHWM), so that each workload reports its own peak: the snapshotter runs
// for the whole benchmark.
func (e *daemon) resetSnapshotterPeak() {
	if pid := e.snapshotterPID(); pid != 0 {
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
	}
}

// snapshotterPeak is cklite-snapshotter's peak resident memory (bytes) since the last reset.
func (e *daemon) snapshotterPeak() uint64 {
	m, err := shimproc.ReadMemory(e.snapshotterPID())
	if err != nil {
		return 0
	}
	return m.Peak
}
