package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"

	"golang.org/x/sys/unix"
)

func TestLookCRIU(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := lookCRIU()
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "CRIU is not installed") {
		t.Fatalf("lookCRIU without criu in PATH: %v, want a FailedPrecondition saying CRIU is not installed", err)
	}
	// Only the lookup: an executable file of that name will do.
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "criu"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	if err := lookCRIU(); err != nil {
		t.Fatalf("lookCRIU with criu in PATH: %v", err)
	}
}

// Building options is pure: no lookup, no mount (go test ./runtime as root leaves the host as it
// found it), whatever PATH holds.
func TestCriuOpts(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for _, tc := range []struct {
		name    string
		in      CheckpointOpts
		wantErr bool
		check   func(*testing.T, CheckpointOpts)
	}{
		{name: "no image path", in: CheckpointOpts{}, wantErr: true},
		{name: "bad empty namespace", in: CheckpointOpts{ImagePath: "/i", EmptyNamespaces: []string{"pid"}}, wantErr: true},
		{name: "defaults", in: CheckpointOpts{ImagePath: "/i", Terminal: true, OpenTCP: true, CgroupsMode: "soft"}},
		{name: "exit", in: CheckpointOpts{ImagePath: "/i", Exit: true, EmptyNamespaces: []string{"network"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := tc.in.criu()
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if err != nil {
				return
			}
			if o.ImagesDirectory != tc.in.ImagePath || o.LeaveRunning == tc.in.Exit || o.ShellJob != tc.in.Terminal ||
				o.TcpEstablished != tc.in.OpenTCP || o.ManageCgroupsMode != tc.in.CgroupsMode || o.StatusFd != -1 ||
				o.EmptyNs != unix.CLONE_NEWNET {
				t.Fatalf("%+v", o)
			}
		})
	}
}

// TestFreezeFor: a leave-running dump of a running task is frozen by a CRIU with LeaveFrozen at
// its seize and kept frozen only for a caller that asked (KeepFrozen) and a dump that succeeded;
// without LeaveFrozen (the host's own criu) the shim freezes first, as before; a dump with Exit
// is frozen first and thawed after; a task the client paused is left to the client.
func TestFreezeFor(t *testing.T) {
	dumpErr := errors.New("CRIU failed")
	for _, tc := range []struct {
		name                     string
		paused, leavesFrozen     bool
		o                        CheckpointOpts
		dumpErr                  error
		shimFreezes, criuFreezes bool
		thaw                     bool
	}{
		{name: "capture, CRIU leaves frozen", leavesFrozen: true, o: CheckpointOpts{KeepFrozen: true}, criuFreezes: true},
		{name: "capture, CRIU leaves frozen, dump fails", leavesFrozen: true, o: CheckpointOpts{KeepFrozen: true}, dumpErr: dumpErr, criuFreezes: true, thaw: true},
		{name: "memory only, CRIU leaves frozen", leavesFrozen: true, criuFreezes: true, thaw: true},
		{name: "capture, fallback", o: CheckpointOpts{KeepFrozen: true}, shimFreezes: true},
		{name: "capture, fallback, dump fails", o: CheckpointOpts{KeepFrozen: true}, dumpErr: dumpErr, shimFreezes: true, thaw: true},
		{name: "memory only, fallback", shimFreezes: true, thaw: true},
		{name: "exit", leavesFrozen: true, o: CheckpointOpts{Exit: true, KeepFrozen: true}, shimFreezes: true, thaw: true},
		{name: "exit, fallback", o: CheckpointOpts{Exit: true}, shimFreezes: true, thaw: true},
		{name: "paused by the client", paused: true, leavesFrozen: true, o: CheckpointOpts{KeepFrozen: true}},
		{name: "paused by the client, dump fails", paused: true, dumpErr: dumpErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shim, criu := freezeFor(tc.paused, tc.o, tc.leavesFrozen)
			if shim != tc.shimFreezes || criu != tc.criuFreezes {
				t.Fatalf("freezeFor: shim freezes %t, CRIU freezes %t; want %t, %t", shim, criu, tc.shimFreezes, tc.criuFreezes)
			}
			if thaw := thawAfter(shim || criu, tc.o, tc.dumpErr); thaw != tc.thaw {
				t.Fatalf("thawAfter: %t, want %t", thaw, tc.thaw)
			}
		})
	}
}

// TestLeaveFrozenProbe: CRIU is asked about leave_frozen once, however often the answer is
// read, and its answer is the shim's.
func TestLeaveFrozenProbe(t *testing.T) {
	for _, has := range []bool{true, false} {
		var asked atomic.Int32
		probe := leaveFrozenProbe(func(feature string) bool {
			asked.Add(1)
			return has && feature == "leave_frozen"
		})
		for range 3 {
			if got := probe(); got != has {
				t.Fatalf("CRIU has leave_frozen: %t, the probe says %t", has, got)
			}
		}
		if n := asked.Load(); n != 1 {
			t.Fatalf("CRIU was asked %d times, want once", n)
		}
	}
}

// TestCRIUHasFeature: `criu check --feature` is CRIU's answer: a criu that knows the feature
// exits 0, one that does not (an older or unpatched criu: "Unknown feature") fails.
func TestCRIUHasFeature(t *testing.T) {
	bin := t.TempDir()
	script := "#!/bin/sh\n[ \"$1 $2 $3\" = \"check --feature leave_frozen\" ]\n"
	if err := os.WriteFile(filepath.Join(bin, "criu"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	if !criuHasFeature(leaveFrozenFeature) {
		t.Fatal("criu says it has leave_frozen, criuHasFeature says it has not")
	}
	if criuHasFeature("network_lock_nftables") {
		t.Fatal("criu says it has not network_lock_nftables, criuHasFeature says it has")
	}
}
