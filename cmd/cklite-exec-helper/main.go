// cklite-exec-helper is the static intermediate that containerd-shim-cklite-v2 executes in front
// of another program: an exec in the container's process tree (pkg/exechelper), and, run as
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
	exechelper.Run(os.Args[1:])
}
