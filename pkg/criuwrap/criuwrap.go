// Package criuwrap is the wrapper through which the cklite shim runs CRIU: run as "criu" (the
// shim puts a link of that name first in its PATH, runtime.InstallCRIUWrapper), it sets a
// parent-death signal and executes the real CRIU in its place, so that no CRIU outlives the shim
// that started it (issue 16 item 3: libcontainer runs "criu" from PATH with no way to set the
// child's attributes). Every dump and restore goes through it, so it must start fast: it lives in
// cklite-exec-helper, the static binary next to the shim, and imports nothing but the standard
// library. As the shim's own binary (cgo, libcontainer's nsenter, every package of containerd's
// to initialise) the wrapper cost ~11 ms of each CRIU run on this loaded 2-core host.
package criuwrap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Environment of the wrapper: the real CRIU, and the pid of the shim that must outlive it.
const (
	RealEnv   = "CKLITE_CRIU"
	ParentEnv = "CKLITE_CRIU_PARENT"
	// Name is what libcontainer runs, and what the wrapper's link is called.
	Name = "criu"
)

// Is reports whether this process was started as the wrapper.
func Is() bool {
	return filepath.Base(os.Args[0]) == Name && os.Getenv(RealEnv) != ""
}

// Run is the wrapper's whole life: parent-death signal, then the real CRIU in its place. It
// returns only on failure.
func Run() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0); errno != 0 {
		return fmt.Errorf("criu wrapper: set parent-death signal: %w", errno)
	}
	// The shim may have died before the signal was set: then nothing would ever send it.
	if parent := os.Getenv(ParentEnv); parent != "" && parent != strconv.Itoa(os.Getppid()) {
		return errors.New("criu wrapper: the shim that started CRIU is gone")
	}
	real := os.Getenv(RealEnv)
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, RealEnv+"=") && !strings.HasPrefix(kv, ParentEnv+"=") {
			env = append(env, kv)
		}
	}
	return syscall.Exec(real, append([]string{real}, os.Args[1:]...), env)
}
