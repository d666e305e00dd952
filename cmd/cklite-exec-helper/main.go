// cklite-exec-helper is the intermediate through which containerd-shim-cklite-v2 starts an exec
// in the container's process tree (pkg/exechelper). It is not meant to be run by hand.
package main

import (
	"os"

	"github.com/cklite/cklite/pkg/exechelper"
)

func main() {
	exechelper.Run(os.Args[1:])
}
