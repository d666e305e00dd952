// Package runtime is the libcontainer + CRIU engine under the cklite shim (the folder's name keeps
// the project's layout; it is no container runtime of its own): it turns an OCI bundle into a runc
// libcontainer container and drives it in-process (create, start, exec, signal, pause, update,
// delete) and through CRIU (checkpoint, restore). No runc binary is executed: the shim binary is
// itself the container init (libcontainer.Init), so every operation costs a function call rather
// than a fork+exec of runc, and checkpoint/restore stay under the shim's control.
package runtime
