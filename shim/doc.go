// Package shim is the task service of containerd-shim-cklite-v2: containerd's task API v3 over
// ttrpc on top of pkg/shim, one shim process per container. It owns process lifecycle (init and
// exec state machines, exit collection, events), stdio (FIFOs, binary:// and file:// loggers,
// consoles) and the rootfs mounts, and drives the libcontainer engine in package runtime.
//
// Reaping: libcontainer waits on its own children (the init stages, setns processes, CRIU), so
// containerd's wait4(-1) reaper is disabled (NoReaper) and every container process's exit is
// collected by a goroutine blocked in libcontainer's Process.Wait. Orphans re-parented to the
// shim (it is a child subreaper) are reaped by a SIGCHLD loop that only touches pids nobody
// owns, and stands aside while libcontainer forks (see reaper.go).
package shim
