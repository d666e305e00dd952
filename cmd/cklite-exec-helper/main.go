// cklite-exec-helper is the intermediate through which containerd-shim-cklite-v2 starts an exec
// in the container's process tree, and, run as exechelper.InitPath, cklite's init: the PID 1 of
// a container that asks for it (pkg/exechelper). It is not meant to be run by hand.
package main

import (
	"os"

	"github.com/cklite/cklite/pkg/exechelper"
)

func main() {
	if exechelper.IsInit(os.Args) {
		exechelper.RunInit(os.Args[2:])
	}
	exechelper.Run(os.Args[1:])
}
