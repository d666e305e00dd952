// containerd-shim-cklite-v2 is cklite's containerd runtime v2 shim (io.containerd.cklite.v2).
// The same binary is the container init: libcontainer re-executes it as "init".
package main

import (
	"context"
	"os"
	goruntime "runtime"

	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/opencontainers/runc/libcontainer"
	_ "github.com/opencontainers/runc/libcontainer/nsenter" // nsexec runs before Go in "init"

	cklite "github.com/cklite/cklite/shim"
)

func init() {
	// main, and nothing else, runs on the main thread for the process's life. libcontainer runs
	// in-process here, not in a short-lived runc: some of its goroutines lock their thread and
	// setns into a container's namespaces for good (goCreateMountSources joins the container's
	// mount namespace), and Go parks a locked main thread forever instead of ending it. The main
	// thread's namespaces are what /proc/self names: on it, the shim took a container's mount
	// namespace for the host's (the exec guard refused every exec, Stats found no cgroup mount).
	goruntime.LockOSThread()
	// The container init must not run the shim's setup: it is libcontainer's, from here on.
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init()
	}
}

func main() {
	cklite.Register()
	shim.RunShim(context.Background(), cklite.NewManager(), func(c *shim.Config) {
		// libcontainer waits on its own children; a wait4(-1) reaper would steal their exits.
		c.NoReaper = true
	})
}
