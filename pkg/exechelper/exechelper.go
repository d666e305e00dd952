// Package exechelper is the intermediate through which the cklite shim starts an exec inside the
// container's process tree (see runtime/treeexec.go), and cklite's init, the PID 1 of a container
// that asks for one (init.go). As the intermediate, run by libcontainer inside the container,
// with the exec's namespaces, cgroup, credentials, seccomp filter, cwd, environment and stdio,
// it forks the exec's program and exits, so that the kernel hands the program to the container's
// PID 1. An exec with a terminal gets the terminal as the controlling one of its own session
// (passTerminal). It is its own static binary (cmd/cklite-exec-helper), executed from an fd the shim
// passes: the shim's binary is linked against the host's libc, which a container image need not
// have (exec of it fails with ENOENT, its ELF interpreter missing). It imports nothing but the
// standard library, so that it links statically.
package exechelper

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"unsafe"
)

// The intermediate's fds: its own binary (what it is executed from), its report to the shim ("ok
// PID" or the error that kept the program from starting), and the shim's go-ahead to exit (EOF).
const (
	BinaryFd = 3
	ReportFd = 4
	GoFd     = 5
)

// Name is the binary's name, next to the shim's.
const Name = "cklite-exec-helper"

// Path is where the shim finds the binary: next to its own, else on PATH.
func Path() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), Name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(Name)
	if err != nil {
		return "", fmt.Errorf("%s, which starts execs in the container's process tree and runs CRIU, is neither next to the shim nor on PATH: %w", Name, err)
	}
	return p, nil
}

// Run is the intermediate's whole life: it starts args and exits. It does not return.
func Run(args []string) {
	for _, fd := range []int{BinaryFd, ReportFd, GoFd} {
		syscall.CloseOnExec(fd)
	}
	report := os.NewFile(ReportFd, "report")
	pid, err := forkArgs(args)
	if err != nil {
		fmt.Fprintf(report, "error: %v\n", err)
		os.Exit(127)
	}
	fmt.Fprintf(report, "ok %d\n", pid)
	report.Close()
	// Exit only once the shim has a pidfd of the child: until then the child, even exited, is
	// this process's unreaped child and its pid cannot be reused.
	buf := make([]byte, 1)
	_, _ = os.NewFile(GoFd, "go").Read(buf)
	os.Exit(0)
}

// forkArgs starts args with this process's stdio, credentials, cwd and environment.
func forkArgs(args []string) (int, error) {
	if len(args) == 0 {
		return 0, fmt.Errorf("no program to run")
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return 0, err
	}
	attr := &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}}
	if attr.Sys, err = passTerminal(); err != nil {
		return 0, err
	}
	return syscall.ForkExec(path, args, attr)
}

// passTerminal hands this process's controlling terminal, if it has one (an exec with a terminal:
// libcontainer made this process a session leader and its pty slave, on fds 0-2, its controlling
// terminal), to the program it starts. Left to this process, the terminal would be hung up when
// it exits (its foreground process group, the program's, gets SIGHUP) and the program would run
// on without a controlling terminal, its job control gone. So this process gives the terminal
// up, and the program becomes the leader of a session of its own with the terminal as its
// controlling one, as it is under runc: a session inside the container, which CRIU dumps and
// restores with it.
func passTerminal() (*syscall.SysProcAttr, error) {
	sid, err := ioctlInt(0, syscall.TIOCGSID)
	if err != nil || sid != os.Getpid() {
		return nil, nil // no terminal, or not this session's
	}
	// Giving up the terminal sends its foreground process group, this process's, SIGHUP and
	// SIGCONT. A handled signal, unlike an ignored one, is back to its default in the program.
	signal.Notify(make(chan os.Signal, 2), syscall.SIGHUP, syscall.SIGCONT)
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCNOTTY, 0); errno != 0 {
		return nil, fmt.Errorf("give up the controlling terminal: %w", errno)
	}
	return &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}, nil
}

func ioctlInt(fd int, req uint) (int, error) {
	var v int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(&v))); errno != 0 {
		return 0, errno
	}
	return int(v), nil
}
