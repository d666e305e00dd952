package exechelper

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
)

// cklite's init.
//
// A PID 1 that never waits for its children (`sleep infinity`, busybox `sleep`, `python app.py`)
// leaves every exec'd process a zombie once it exits: execs run as orphans of the container's
// PID 1 (runtime/treeexec.go). With the init enabled (shim/init.go) the container's PID 1 is this
// binary run as InitPath: as docker --init and tini, it starts the entrypoint as its only child
// (the same stdio, credentials, cwd and environment; on a terminal, as the leader of a session of
// its own with the terminal as its controlling one), forwards every signal it can catch to it, reaps every
// child the kernel hands it (waitpid(-1)), and exits with the entrypoint's status once the
// entrypoint exits (128+N when signal N killed it, as containerd reports for a runc task); the
// kernel then kills what is left in the container's PID namespace. It is dumped with every
// checkpoint, hence small: one P, and a garbage collector that keeps its heap near its live size.

// InitPath is where the shim bind-mounts this binary in a container that runs cklite's init: in
// the container's /dev, a tmpfs, so that its mount point is no file of the rootfs's upper layer.
// Run as InitPath with "--" and the entrypoint's args, the binary is the init.
const InitPath = "/dev/.cklite-init"

// IsInit reports whether the binary was started as the init (args are os.Args).
func IsInit(args []string) bool {
	return len(args) >= 2 && args[0] == InitPath && args[1] == "--"
}

// RunInit is the init's whole life (args are the entrypoint's): it does not return.
func RunInit(args []string) {
	runtime.GOMAXPROCS(1)
	debug.SetGCPercent(20)
	os.Exit(runInit(args))
}

// notForwarded are the signals the init keeps: SIGCHLD tells it to reap; SIGURG is the Go
// runtime's own preemption signal; SIGTTIN and SIGTTOU are the terminal's to the init itself,
// in the background once the entrypoint holds the foreground (caught, they do not stop it).
var notForwarded = map[syscall.Signal]bool{
	syscall.SIGCHLD: true, syscall.SIGURG: true, syscall.SIGTTIN: true, syscall.SIGTTOU: true,
}

// runInit starts args and returns the init's exit code.
func runInit(args []string) int {
	// Every catchable signal is caught before the entrypoint starts: none sent in between is
	// lost. A caught signal is back to its default in the entrypoint (execve resets handlers).
	sigs := make(chan os.Signal, 64)
	// SIGCHLD has a channel of its own: os/signal drops a signal whose channel is full, and a
	// flood of forwarded signals must not cost the entrypoint's exit. One slot is enough: a
	// wake-up reaps every child that has exited, and a SIGCHLD that finds the slot taken is
	// covered by the wake-up pending there.
	chld := make(chan os.Signal, 1)
	sys := handOverTerminal(func() { signal.Notify(chld, syscall.SIGCHLD); signal.Notify(sigs) })
	// Not PID 1 (a shared PID namespace, a test): orphans below it are still its to reap.
	_ = setChildSubreaper()
	child, err := startEntrypoint(args, sys)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cklite init: %v\n", err)
		return 127
	}
	if sys != nil {
		leaveTerminal()
	}
	return supervise(child, sigs, chld)
}

// supervise forwards the signals of sigs to the entrypoint child and, on each wake-up of chld,
// reaps until the entrypoint has exited; it returns the init's exit code. sigs also gets SIGCHLD
// (signal.Notify of every signal), which is not forwarded.
func supervise(child int, sigs, chld <-chan os.Signal) int {
	for {
		select {
		case <-chld:
			if ws, exited := reap(child); exited {
				return exitCode(ws)
			}
		case sig := <-sigs:
			if s, ok := sig.(syscall.Signal); ok && !notForwarded[s] {
				_ = syscall.Kill(child, s)
			}
		}
	}
}

// handOverTerminal calls catch, which starts catching signals, and returns how the entrypoint
// must start. When the init leads the session of its terminal (libcontainer made it the session
// leader with its pty as controlling terminal), it gives the terminal up and the entrypoint
// starts as the leader of a session of its own with the terminal as its controlling one, as it
// would run as PID 1 under runc: its group is the foreground one, so job control and ^C reach it
// and not the init. CRIU dumps a terminal only in that shape: a process holding /dev/tty (an
// interactive shell does) must be in a session whose leader's group is the terminal's foreground
// one ("ctty inheritance detected" otherwise), which an init leading the session is not.
func handOverTerminal(catch func()) *syscall.SysProcAttr {
	sid, err := ioctlInt(0, syscall.TIOCGSID)
	if err != nil || sid != os.Getpid() {
		catch()
		return nil // no terminal, or not this session's
	}
	// Giving up the terminal sends its foreground process group SIGHUP and SIGCONT: they are
	// received here, before the signals to forward are caught, when that group is the init's.
	fg, err := ioctlInt(0, syscall.TIOCGPGRP)
	tty := make(chan os.Signal, 2)
	signal.Notify(tty, syscall.SIGHUP, syscall.SIGCONT)
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCNOTTY, 0); errno != 0 {
		signal.Stop(tty)
		catch()
		return nil // the entrypoint runs in the init's session
	}
	if err == nil && fg == syscall.Getpgrp() {
		seen := map[os.Signal]bool{}
		for len(seen) < 2 {
			seen[<-tty] = true
		}
	}
	catch()
	signal.Stop(tty)
	return &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
}

// leaveTerminal points the init's stdio, the terminal it handed over, at /dev/null. CRIU dumps a
// file shared by several processes once, through the first of them, the init: a terminal read
// there, outside its session, has neither session nor foreground group (TIOCGSID fails), and the
// dump of the entrypoint's /dev/tty is refused ("ctty inheritance detected").
func leaveTerminal() {
	null, err := syscall.Open("/dev/null", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	for fd := 0; fd <= 2; fd++ {
		if err == nil {
			_ = syscall.Dup3(null, fd, 0)
		} else {
			_ = syscall.Close(fd)
		}
	}
	if err == nil {
		_ = syscall.Close(null)
	}
}

// startEntrypoint starts args with the init's stdio, and sys.
func startEntrypoint(args []string, sys *syscall.SysProcAttr) (int, error) {
	if len(args) == 0 {
		return 0, fmt.Errorf("no entrypoint to run")
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return 0, err // names args[0]
	}
	attr := &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}, Sys: sys}
	pid, err := syscall.ForkExec(path, args, attr)
	if err != nil {
		return 0, fmt.Errorf("exec %s: %w", args[0], err)
	}
	return pid, nil
}

// reap waits for every child that has exited (SIGCHLD is not queued: one may stand for many),
// and reports the entrypoint's status if it is among them.
func reap(child int) (syscall.WaitStatus, bool) {
	var childWs syscall.WaitStatus
	exited := false
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return childWs, exited
		}
		if pid == child {
			childWs, exited = ws, true
		}
	}
}

// exitCode is the init's exit code for the entrypoint's wait status: its exit code, or 128+N
// when signal N killed it.
func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

func setChildSubreaper() error {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return errno
	}
	return nil
}
