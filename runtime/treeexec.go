package runtime

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/exechelper"
)

// Execs in the container's process tree.
//
// libcontainer starts an exec as a child of the shim, outside the init's process tree, which is
// all that CRIU dumps. ExecInTree starts it through a short-lived intermediate instead
// (pkg/exechelper, run by libcontainer inside the container with the exec's namespaces, cgroup,
// credentials, seccomp filter, cwd and environment as "/proc/self/fd/3 ARGS..."), which forks
// ARGS and exits. The kernel hands an orphan to the nearest child subreaper in its own PID
// namespace, else to that namespace's init: the exec'd process becomes a child of the
// container's PID 1 and is dumped, restored and killed with the init's tree.
//
// The shim is then no longer its parent: it holds a pidfd of it (taken while the intermediate,
// which does not reap, still pins its pid) and reads its exit status from the pidfd once it
// is reaped (PIDFD_INFO_EXIT, kernel >= 6.15) or from /proc/PID/stat while it is a zombie
// (TreeExitStatus).

// TreeProcess is an exec'd process in the container's process tree.
type TreeProcess struct {
	Pid   int      // in the shim's PID namespace
	NSPid int      // in the container's PID namespace: what a restore gives it back
	Start uint64   // start time (/proc/PID/stat): tells a zombie of it from a reuse of its pid
	PidFD *os.File // for its exit (TreeExitStatus)
	Stdio []string // identities of its fds 0-2 ("pipe:[N]", ...): what a restore re-supplies
	// Tty is CRIU's name ("tty[rdev:dev]") of the pty slave on its fds 0-2 when it runs on a
	// terminal, whose master the shim holds: a dump names it external, a restore gives it a new
	// slave (ExternalTty).
	Tty string
}

// ExecInTree runs p in the container as a child of its init (see above). p's stdio must be set.
func (c *Container) ExecInTree(p *libcontainer.Process) (*TreeProcess, error) {
	helper, err := exechelper.Path()
	if err != nil {
		return nil, fmt.Errorf("exec process: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	bin, err := os.Open(helper)
	if err != nil {
		return nil, fmt.Errorf("exec process: %w", err)
	}
	defer bin.Close()
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
	p.Args = append([]string{fmt.Sprintf("/proc/self/fd/%d", exechelper.BinaryFd)}, p.Args...)
	p.ExtraFiles = []*os.File{bin, reportW, goR} // exechelper's fds
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
	if tp.Start, err = startTime(pid); err != nil {
		tp.PidFD.Close()
		return nil, err
	}
	tp.Stdio = make([]string, 3)
	for i := range tp.Stdio {
		tp.Stdio[i], _ = os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, i))
		if tp.Tty == "" {
			tp.Tty = ptySlaveName(pid, i)
		}
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
