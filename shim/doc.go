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
//
// Lifecycle: a process's states and which may follow which are one table, transitions in
// lifecycle.go (created, running, paused, checkpointing, restoring, stopped, deleted); every state
// change is checked against it and made in one step under the process's mutex, so an exit
// collected meanwhile is never overwritten.
//
// Calls during a checkpoint or rollback: they wait for it, as with runc-v2's Init.mu. Each
// container has one lifecycle lock; Checkpoint and the in-place rollback hold it from their first
// check to their last step (dump or kill, rootfs switch, restore), and every call that acts on
// the init or the engine takes it: Start, Exec, Kill of the init, Pause, Resume, Update, Pids,
// State of the init, Delete, another Checkpoint. Such a call therefore runs before the cycle or
// after it, on the engine the cycle left (the restored one, or none if the task stopped), and
// answers from the state the cycle left: a Kill then signals the restored task, a Pause pauses
// it, a Delete of a task that runs on fails with FailedPrecondition and one of a task whose
// restore failed deletes it. It never acts on an engine being dumped or destroyed. Waiting was
// chosen over failing at once (FailedPrecondition, "a checkpoint is in progress") because
// containerd and the kubelet do not retry a failed Kill or Delete: a refused Kill would leave a
// container running that its owner wanted gone. One exception: while CRIU restores (at Start or
// in place, under its watchdog), a Kill or Delete of the task first ends that restore
// (cancelRestore), so that it does not wait on a restore that may not finish; the task then ends
// stopped and the queued call acts on that. Calls that do not touch the engine do not wait:
// Wait, Stats (the cgroup it read last), CloseIO, ResizePty, Connect, Kill of an exec; nor does
// State during a restore at Start, which answers created: containerd gives State 2 s and fails
// it past them, and a logging binary (nerdctl's) started by the restore asks for the task
// meanwhile and gives up on such a failure, so the restored task's output would reach no log. The engine
// itself is read through container.engine(), under the container's mutex, everywhere.
//
// The in-place cycle that a checkpoint leaving the task running and a rollback share is written
// once (inplace.go); the restore of a container created from a checkpoint is restore.go; the
// one conversion of CRIU options is criuopts.go. The engine (engine.go) and containerd's API
// (containerd.go) are small interfaces, so that the lifecycle is unit-tested with fakes.
package shim
