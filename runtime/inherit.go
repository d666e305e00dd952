package runtime

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// inheritFdBase is where InheritPipes puts its fds: above the few that exec.Cmd gives CRIU (its
// stdio, the RPC socket and libcontainer's namespace fds), which would overwrite lower ones.
const inheritFdBase = 100

// InheritPipes prepares pipes (by identity, "pipe:[N]") for a restore: CRIU gives each restored
// fd on such a pipe the file passed here instead of a new pipe whose other end nobody holds. So
// it does for an external terminal ("tty[rdev:dev]", exttty.go), whose file is a pty slave.
// libcontainer passes CRIU only the init's stdio (descriptors.json), so each file is duplicated
// onto an fd without close-on-exec that CRIU, started by libcontainer, inherits, and named to it
// by an inherit-fd line of the restore's CRIU configuration (WithCRIUOptions). Until release is
// called, any other process the shim starts inherits those fds too: the caller holds the
// container's lifecycle, so no exec of this container starts meanwhile.
func InheritPipes(pipes map[string]*os.File) (options []string, release func(), err error) {
	var fds []int
	release = func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	for name, f := range pipes {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD, inheritFdBase)
		if err != nil {
			release()
			return nil, func() {}, fmt.Errorf("pass %s to CRIU: %w", name, err)
		}
		fds = append(fds, fd)
		options = append(options, fmt.Sprintf("inherit-fd fd[%d]:%s", fd, name))
	}
	return options, release, nil
}
