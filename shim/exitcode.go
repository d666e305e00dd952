package shim

import (
	"os"
	"syscall"
)

// exitCodeUnknown is reported when the exit could not be collected at all.
const exitCodeUnknown = 255

// exitCode turns a wait status into the code containerd reports: the exit status, or
// 128+signal for a process killed by a signal (what a shell would report).
func exitCode(st *os.ProcessState) int {
	if st == nil {
		return exitCodeUnknown
	}
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok {
		return st.ExitCode()
	}
	return waitStatusCode(ws)
}

func waitStatusCode(ws syscall.WaitStatus) int {
	switch {
	case ws.Signaled():
		return 128 + int(ws.Signal())
	case ws.Exited():
		return ws.ExitStatus()
	}
	return exitCodeUnknown
}
