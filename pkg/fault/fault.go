// Package fault is a test-only hook: named points in the shim, the snapshotter and the switch of
// a container's rootfs where the fault-injection suite (integration/fault*_test.go) makes the
// process die with SIGKILL, as a crash or an OOM kill would, to check that what it leaves behind
// is recovered. Nothing happens unless a test sets one of the environment variables:
//
//	CKLITE_FAULT=point[:n]       kill this process the n-th time (default 1) it reaches point;
//	CKLITE_FAULT_FILE=path       the same spelling, read from path at every point: a test arms
//	                             and disarms faults of daemons that run on (containerd passes
//	                             its environment to the shims it starts).
//
// The count is per process: a restarted process starts again from 0. A point costs one map
// lookup of a variable that is not set in production.
package fault

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

const (
	// Env arms one fault for the life of the process.
	Env = "CKLITE_FAULT"
	// FileEnv names a file holding the armed fault ("" or no file: none).
	FileEnv = "CKLITE_FAULT_FILE"
)

// Named points, where the binaries call Point.
const (
	ShimAfterDump      = "shim-after-dump"      // the checkpoint's CRIU dump is complete
	SwitchPrepared     = "switch-prepared"      // a switch's fresh key exists, the container does not refer to it yet
	SwitchUpdated      = "switch-updated"       // the container refers to the fresh key, the old one is not removed yet
	SnapshotterCommit  = "snapshotter-commit"   // the snapshotter's commit transaction is written, not yet committed
	ShimRollbackKilled = "shim-rollback-killed" // a rollback killed the task, its rootfs is not switched yet
)

var hits struct {
	sync.Mutex
	spec  string // the spec the count is for
	count int
}

// Point kills the process with SIGKILL if the armed fault names point and this is its n-th hit.
func Point(point string) {
	spec := armed()
	if spec == "" {
		return
	}
	name, n := parse(spec)
	if name != point {
		return
	}
	hits.Lock()
	if hits.spec != spec {
		hits.spec, hits.count = spec, 0
	}
	hits.count++
	due := hits.count == n
	hits.Unlock()
	if due {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught: nothing runs after it is delivered
	}
}

// armed is the fault spec: CKLITE_FAULT's, or the content of CKLITE_FAULT_FILE's file.
func armed() string {
	if spec := os.Getenv(Env); spec != "" {
		return spec
	}
	file := os.Getenv(FileEnv)
	if file == "" {
		return ""
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// parse splits "point[:n]"; a missing or invalid n is 1.
func parse(spec string) (string, int) {
	name, count, ok := strings.Cut(spec, ":")
	if !ok {
		return name, 1
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return name, 1
	}
	return name, n
}
