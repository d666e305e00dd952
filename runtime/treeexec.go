package runtime

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"
)

// Execs in the container's process tree.
//
// libcontainer starts an exec as a child of the shim, outside the init's process tree, which is
// all that CRIU dumps. ExecInTree starts it through a short-lived intermediate instead: the shim's
// own binary, run by libcontainer inside the container (namespaces, cgroup, credentials, seccomp,
// cwd and environment of the exec) as "/proc/self/fd/3 cklite-exec-helper ARGS...", forks ARGS
// and exits. The kernel hands an orphan to the nearest child subreaper in its own PID namespace,
// else to that namespace's init: the exec'd process becomes a child of the container's PID 1
// and is dumped, restored and killed with the init's tree.
//
// The shim is then no longer its parent: it holds a pidfd of it (taken while the intermediate,
// which does not reap, still pins its pid) and reads its exit status from the pidfd once it
// is reaped (PIDFD_INFO_EXIT, kernel >= 6.15) or from /proc/PID/stat while it is a zombie
// (TreeExitStatus). The intermediate's fds: 3 its binary, 4 its report to the shim ("ok" or
// the error that kept ARGS from starting), 5 the shim's go-ahead to exit (EOF).
const execHelperArg = "cklite-exec-helper"

const (
	helperBinaryFd = 3
	helperReportFd = 4
	helperGoFd     = 5
)

// IsExecHelper reports whether this process was started as ExecInTree's intermediate.
func IsExecHelper() bool {
	return len(os.Args) > 2 && os.Args[1] == execHelperArg
}

// RunExecHelper is the intermediate's whole life; it does not return.
func RunExecHelper() {
	for _, fd := range []int{helperBinaryFd, helperReportFd, helperGoFd} {
		syscall.CloseOnExec(fd)
	}
	report := os.NewFile(helperReportFd, "report")
	pid, err := forkArgs(os.Args[2:])
	if err != nil {
		fmt.Fprintf(report, "error: %v\n", err)
		os.Exit(127)
	}
	fmt.Fprintf(report, "ok %d\n", pid)
	report.Close()
	// Exit only once the shim has a pidfd of the child: until then the child, even exited, is
	// this process's unreaped child and its pid cannot be reused.
	buf := make([]byte, 1)
	_, _ = os.NewFile(helperGoFd, "go").Read(buf)
	os.Exit(0)
}

// forkArgs starts args with this process's stdio, credentials, cwd and environment.
func forkArgs(args []string) (int, error) {
	path, err := exec.LookPath(args[0])
	if err != nil {
		return 0, err
	}
	return syscall.ForkExec(path, args, &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}})
}

// TreeProcess is an exec'd process in the container's process tree.
type TreeProcess struct {
	Pid   int      // in the shim's PID namespace
	NSPid int      // in the container's PID namespace: what a restore gives it back
	PidFD *os.File // for its exit (TreeExitStatus)
	Stdio []string // identities of its fds 0-2 ("pipe:[N]", ...): what a restore re-supplies
}

// ExecInTree runs p in the container as a child of its init (see above). p's stdio must be set.
func (c *Container) ExecInTree(p *libcontainer.Process) (*TreeProcess, error) {
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("exec process: the shim's binary: %w", err)
	}
	defer self.Close()
	reportR, reportW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("exec process: %w", err)
	}
	defer reportR.Close()
	goR, goW, err := os.Pipe()
	if err != nil {
		reportW.Close()
		return nil, fmt.Errorf("exec process: %w", err)
	}
	defer goW.Close()
	p.Args = append([]string{fmt.Sprintf("/proc/self/fd/%d", helperBinaryFd), execHelperArg}, p.Args...)
	p.ExtraFiles = []*os.File{self, reportW, goR}
	err = c.Exec(p)
	reportW.Close()
	goR.Close()
	if err != nil {
		return nil, err
	}
	tp, err := takeChild(p, reportR)
	if err != nil {
		_ = p.Signal(unix.SIGKILL)
	}
	goW.Close() // the intermediate exits
	if _, werr := p.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("exec process: intermediate: %w", werr)
	}
	if err != nil {
		if tp != nil {
			_ = unix.Kill(tp.Pid, unix.SIGKILL)
			tp.PidFD.Close()
		}
		return nil, err
	}
	return tp, nil
}

// takeChild reads the intermediate's report and takes hold of the child it started.
func takeChild(p *libcontainer.Process, report *os.File) (*TreeProcess, error) {
	line, err := bufio.NewReader(report).ReadString('\n')
	line = strings.TrimSpace(line)
	if msg, ok := strings.CutPrefix(line, "error: "); ok {
		return nil, fmt.Errorf("exec failed: unable to start container process: %s: %w", msg, errdefs.ErrFailedPrecondition)
	}
	if !strings.HasPrefix(line, "ok ") {
		return nil, fmt.Errorf("exec process: the intermediate ended without a report (%q): %w", line, err)
	}
	helper, err := p.Pid()
	if err != nil {
		return nil, fmt.Errorf("exec process: %w", err)
	}
	kids, err := childrenOf(helper)
	if err != nil {
		return nil, err
	}
	if len(kids) != 1 {
		return nil, fmt.Errorf("exec process: the intermediate %d has %d children, want 1", helper, len(kids))
	}
	return treeProcessOf(kids[0])
}

// treeProcessOf takes a pidfd of pid and reads what a restore needs of it.
func treeProcessOf(pid int) (*TreeProcess, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd of exec'd process %d: %w", pid, err)
	}
	tp := &TreeProcess{Pid: pid, PidFD: os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))}
	if tp.NSPid, err = nsPid(pid); err != nil {
		tp.PidFD.Close()
		return nil, err
	}
	tp.Stdio = make([]string, 3)
	for i := range tp.Stdio {
		tp.Stdio[i], _ = os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, i))
	}
	return tp, nil
}

// childrenOf lists pid's children, from every thread's children file.
func childrenOf(pid int) ([]int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, fmt.Errorf("children of %d: %w", pid, err)
	}
	var kids []int
	for _, t := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			var k int
			if _, err := fmt.Sscan(f, &k); err == nil {
				kids = append(kids, k)
			}
		}
	}
	return kids, nil
}

// FindTreeProcess finds, among pids (the container's, after a restore), the process whose pid in
// the container's PID namespace is nspid, and takes hold of it as ExecInTree did.
func FindTreeProcess(pids []int, nspid int) (*TreeProcess, error) {
	for _, pid := range pids {
		if n, err := nsPid(pid); err == nil && n == nspid {
			return treeProcessOf(pid)
		}
	}
	return nil, fmt.Errorf("no process with pid %d in the container: %w", nspid, errdefs.ErrNotFound)
}

// errNoNSPid is returned for a process gone, or a kernel without NSpid.
var errNoNSPid = errors.New("no NSpid line")
