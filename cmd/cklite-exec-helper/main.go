// cklite-exec-helper is the static intermediate that containerd-shim-cklite-v2 executes in front
// of another program: an exec in the container's process tree (pkg/exechelper); run as
// exechelper.InitPath, cklite's init, the PID 1 of a container that asks for it; and run as
// "criu", CRIU itself (pkg/criuwrap: CRIU dies with the shim). It is not meant to be run by hand.
package main

import (
	"fmt"
	"os"

	"github.com/cklite/cklite/pkg/criuwrap"
	"github.com/cklite/cklite/pkg/exechelper"
)

func main() {
	if criuwrap.Is() {
		err := criuwrap.Run()
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if exechelper.IsInit(os.Args) {
		exechelper.RunInit(os.Args[2:])
	}
	exechelper.Run(os.Args[1:])
}
