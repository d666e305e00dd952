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
// With CKLITE_FAULT_FILE, "point[:n]:hold" holds the process at point instead: it opens the FIFO
// path.hold for reading, which blocks until the test opens it for writing (so the test knows the
// process is there), and reads until the test closes it. Meanwhile the test kills another process
// (containerd, the snapshotter) at a known step of this one's work.
//
// The count is per process: a restarted process starts again from 0. A point costs one lookup of
// an environment variable that is not set in production.
package fault

import (
	"io"
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
	ShimAfterDump     = "shim-after-dump"    // a CRIU dump is complete (runtime: checkpoints and forks)
	SwitchPrepared    = "switch-prepared"    // a switch's fresh key exists, the container does not refer to it yet
	SwitchUpdated     = "switch-updated"     // the container refers to the fresh key, the old one is not removed yet
	SnapshotterCommit = "snapshotter-commit" // the snapshotter's commit is written, its transaction not committed
	PagechainSwap     = "pagechain-swap"     // a rewritten pages file is in place, the pagemap naming it not yet (pkg/pagechain)
	PagechainCompress = "pagechain-compress" // a compressed pages file is in place, the plain one not removed yet (pkg/pagechain)

	// The crash-safe freeze of a container's rootfs (freeze.Rootfs: the switch rule's checkpoint).
	FreezeLent          = "freeze-lent"           // a borrower of the container's upper exists, not committed
	FreezeCommitted     = "freeze-committed"      // the borrower is committed, the container still on its key
	FreezeMoved         = "freeze-moved"          // the container is on a fresh key on the layer, its old key lent
	FreezeHandedOver    = "freeze-handed-over"    // the old key's directory is the layer's, the key not removed
	FreezeRenamed       = "freeze-renamed"        // the container is on its key again, the fresh one not removed
	SnapshotterHandOver = "snapshotter-hand-over" // the snapshotter exchanged a lent upper, its transaction not committed

	// cklite checkpoint export (pkg/client).
	ExportLayers  = "export-layers"  // the image's blobs are in the content store, no record or archive yet
	ExportArchive = "export-archive" // the archive is written under its temporary name
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
	name, n, hold := parse(spec)
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
	switch {
	case !due:
	case hold:
		holdAt()
	default:
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught: nothing runs after it is delivered
	}
}

// holdAt blocks until the test has opened and closed the FIFO next to the fault file.
func holdAt() {
	f, err := os.OpenFile(os.Getenv(FileEnv)+".hold", os.O_RDONLY, 0)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = io.Copy(io.Discard, f)
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

// parse splits "point[:n][:hold]"; a missing or invalid n is 1.
func parse(spec string) (name string, n int, hold bool) {
	fields := strings.Split(spec, ":")
	name, n = fields[0], 1
	for _, f := range fields[1:] {
		if f == "hold" {
			hold = true
		} else if v, err := strconv.Atoi(f); err == nil && v > 0 {
			n = v
		}
	}
	return name, n, hold
}
