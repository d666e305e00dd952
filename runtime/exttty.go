package runtime

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/containerd/console"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Terminals of execs, external to the dump.
//
// An exec with a terminal runs on a pty slave whose master the shim holds, outside the dump.
// CRIU can dump such a slave alone only once (it restores one unpaired pty slave by making a
// master in the container's devpts and handing it to the runtime, which is how the init's terminal
// comes back: orphan-pts-master, one per restore). Every exec's terminal is dumped as an external
// tty instead ("external tty[rdev:dev]", ExternalTty), which CRIU records by that name alone
// (its settings, window size, session and foreground group), and a restore gives CRIU a slave
// for it ("inherit-fd fd[N]:tty[rdev:dev]", through InheritPipes): a new pty pair the shim makes
// (NewTty), whose master the shim keeps. The session leader on it gets it back as its
// controlling terminal. The new pair is the host's (/dev/ptmx): the container's devpts is
// restored by CRIU itself, after the slave has to be given.

// unix98PtySlaveMajor is the first major of the pty slaves; the kernel uses up to 8 of them.
const unix98PtySlaveMajor = 136

// ptySlaveName is CRIU's name of the terminal on fd of pid when it is a pty slave, else "".
func ptySlaveName(pid, fd int) string {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), &st); err != nil {
		return ""
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) < unix98PtySlaveMajor || unix.Major(st.Rdev) >= unix98PtySlaveMajor+8 {
		return ""
	}
	return fmt.Sprintf("tty[%x:%x]", st.Rdev, st.Dev)
}

// TtyName is CRIU's name of the terminal f, a pty slave.
func TtyName(f *os.File) string {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return ""
	}
	return fmt.Sprintf("tty[%x:%x]", st.Rdev, st.Dev)
}

var ttyNameRE = regexp.MustCompile(`^tty\[[0-9a-f]+:[0-9a-f]+\]$`)

// IsTtyName reports whether name is CRIU's name of a terminal, as ptySlaveName writes it.
func IsTtyName(name string) bool { return ttyNameRE.MatchString(name) }

// ExternalTty is the dump option that makes the terminal name external.
func ExternalTty(name string) string { return "external " + name }

// NewTty makes a new pty pair for a restore: the master for the shim, the slave for CRIU.
//
// The master is opened as a plain fd, never one Go's poller owns (as console.NewPty's
// os.OpenFile would): a read of a pollable file parks inside Go until data comes, and the console
// epoller's read holds the console's lock meanwhile, which the epoller's single wait loop then
// takes for that console's next event, stalling every other console of the shim until data
// comes (a task's terminal went silent after an exec's terminal moved onto such a master).
func NewTty() (console.Console, *os.File, error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("new pty for a restored terminal: %w", err)
	}
	ptmx := os.NewFile(uintptr(fd), "/dev/ptmx")
	master, path, err := console.NewPtyFromFile(ptmx)
	if err != nil {
		ptmx.Close()
		return nil, nil, fmt.Errorf("new pty for a restored terminal: %w", err)
	}
	// Opened blocking, as a process expects its terminal (os.OpenFile would make it
	// non-blocking, a flag the restored process would share).
	sfd, err := unix.Open(path, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open the slave of a new pty for a restored terminal: %w", err)
	}
	return master, os.NewFile(uintptr(sfd), path), nil
}

// A process on an exec's terminal may also hold it through /dev/tty (busybox's sh does, for job
// control). CRIU dumps such an fd as the controlling terminal of its session only when the
// session's pty is in the dump ("ctty inheritance detected ... no PTY peer"), which an external one
// is not. So /dev/tty is named external too, and a restore gives it the same new slave as the
// terminal it stands for. CRIU knows a terminal only by its device and filesystem: every /dev/tty
// of the container has the one name, which can stand for one terminal only.

// ttyAuxMajor and devTtyMinor are /dev/tty's device number, 5:0.
const (
	ttyAuxMajor = 5
	devTtyMinor = 0
)

// DevTtyAliases finds, among pids (the container's processes), those holding /dev/tty open, and
// returns the terminal each /dev/tty stands for: sessions maps the host pid of the leader of
// each exec's session to its terminal's name. A /dev/tty held in two of those sessions, or in one
// of them and another (the init's terminal), cannot be dumped: the error names the processes.
func DevTtyAliases(pids []int, sessions map[int]string) (map[string]string, error) {
	aliases := map[string]string{}
	holders := map[string][]string{} // /dev/tty's name -> "pid (session S)"
	for _, pid := range pids {
		names := devTtyFds(pid)
		if len(names) == 0 {
			continue
		}
		sid, err := sessionOf(pid)
		if err != nil {
			continue // gone
		}
		for _, name := range names {
			nspid, _ := nsPid(pid)
			holders[name] = append(holders[name], fmt.Sprintf("%d (pid %d in the container, session %d)", pid, nspid, sid))
			tty, ours := sessions[sid]
			if !ours {
				tty = "another terminal"
			}
			if prev, seen := aliases[name]; seen && prev != tty {
				return nil, fmt.Errorf("processes %s hold /dev/tty open on two terminals (%s, %s): CRIU can restore /dev/tty as one external terminal only; close /dev/tty in all but one session first (busybox sh holds it while it runs interactively): %w",
					strings.Join(holders[name], ", "), prev, tty, errdefs.ErrFailedPrecondition)
			}
			aliases[name] = tty
		}
	}
	for name, tty := range aliases {
		if tty == "another terminal" {
			delete(aliases, name) // nothing of an exec: CRIU dumps it as it always has
		}
	}
	return aliases, nil
}

// TtySessions finds, among pids, the leaders of sessions on one of ttys (a process whose fds 0-2
// hold one of them and whose session is its own): for DevTtyAliases, sessions whose terminal the
// shim made at a restore, as it keeps no exec for them.
func TtySessions(pids []int, ttys []string, sessions map[int]string) {
	want := map[string]bool{}
	for _, tty := range ttys {
		want[tty] = true
	}
	for _, pid := range pids {
		if sid, err := sessionOf(pid); err != nil || sid != pid {
			continue
		}
		for fd := range 3 {
			if name := ptySlaveName(pid, fd); want[name] {
				sessions[pid] = name
				break
			}
		}
	}
}

// devTtyFds are the names of the /dev/tty files pid holds open.
func devTtyFds(pid int) []string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var names []string
	for _, fd := range fds {
		var st unix.Stat_t
		if err := unix.Stat(dir+"/"+fd.Name(), &st); err != nil {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && unix.Major(st.Rdev) == ttyAuxMajor && unix.Minor(st.Rdev) == devTtyMinor {
			names = append(names, fmt.Sprintf("tty[%x:%x]", st.Rdev, st.Dev))
		}
	}
	return names
}

// sessionOf is pid's session id, as the shim sees it (field 6 of /proc/PID/stat).
func sessionOf(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	fields, err := statFields(string(data), 6)
	if err != nil {
		return 0, fmt.Errorf("session of %d: %w", pid, err)
	}
	return strconv.Atoi(fields[3])
}
