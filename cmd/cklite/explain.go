package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// dialRE finds the socket a gRPC connection failed to dial in an error's text: containerd passes
// a proxy plugin's dial error on as text, inside its own ("dial unix:///run/x.sock: timeout" from
// containerd 2.4's proxy, "dial unix /run/x.sock: connect: ..." from a plain dialer).
var dialRE = regexp.MustCompile(`dial unix(?: |://)([^:" ]+)`)

// errSnapshotterDown is what a command fails with when containerd cannot reach
// cklite-snapshotter: the one proxy plugin cklite's commands need besides containerd, whose
// own socket connect checks first.
type errSnapshotterDown struct {
	address string
	err     error
}

func (e errSnapshotterDown) Error() string {
	return fmt.Sprintf("cklite-snapshotter is not reachable at %s; is it running? (cklite daemon start, or its service)", e.address)
}

func (e errSnapshotterDown) Unwrap() error { return e.err }

// snapshotterDown returns the errSnapshotterDown that err hides, if any: a failed dial of a
// socket other than containerd's (at address).
func snapshotterDown(err error, address string) (errSnapshotterDown, bool) {
	var down errSnapshotterDown
	if errors.As(err, &down) {
		return down, true
	}
	if err == nil {
		return down, false
	}
	if m := dialRE.FindStringSubmatch(err.Error()); m != nil && m[1] != strings.TrimPrefix(address, "unix://") {
		return errSnapshotterDown{address: m[1], err: err}, true
	}
	return down, false
}

// explain puts what the user can act on before a raw error: a snapshotter that is down is said in
// one sentence, not as containerd's nested dial error.
func explain(err error, address string) error {
	if down, ok := snapshotterDown(err, address); ok {
		return down
	}
	return err
}
