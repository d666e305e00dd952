package exechelper

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The init is this test binary run with initEnv set: no root needed. Not PID 1 here, it reaps
// the orphans below it as a child subreaper.
const initEnv = "CKLITE_TEST_RUN_INIT"

func TestMain(m *testing.M) {
	if os.Getenv(initEnv) == "1" && len(os.Args) > 1 && os.Args[1] == "--" {
		RunInit(os.Args[2:])
	}
	os.Exit(m.Run())
}

// startInit runs the init on sh -c script; its stdout lines are read with the returned reader.
func startInit(t *testing.T, script string) (*exec.Cmd, *bufio.Reader, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), initEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewReader(out), func() { stdin.Close() }
}

func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read the entrypoint's output: %v", err)
	}
	return strings.TrimSpace(line)
}

// exitOf waits for the init and returns its exit code.
func exitOf(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode()
}

// TestInitStatusAndSignals: the init exits with the entrypoint's status, 128+N when signal N
// killed it, and forwards a signal sent to it to the entrypoint.
func TestInitStatusAndSignals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string // prints "ready" once its traps are set
		signal syscall.Signal
		want   int
	}{
		{"exit", "echo ready; exit 3", 0, 3},
		{"killed", "echo ready; kill -9 $$", 0, 137},
		{"trapped TERM", `trap "exit 42" TERM; echo ready; while :; do sleep 1 & wait; done`, syscall.SIGTERM, 42},
		{"default TERM", "echo ready; exec sleep 1000", syscall.SIGTERM, 143},
		{"HUP", "echo ready; exec sleep 1000", syscall.SIGHUP, 129},
		{"USR1 trapped", `trap "exit 7" USR1; echo ready; while :; do sleep 1 & wait; done`, syscall.SIGUSR1, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, out, _ := startInit(t, tc.script)
			if got := readLine(t, out); got != "ready" {
				t.Fatalf("entrypoint printed %q", got)
			}
			if tc.signal != 0 {
				if err := cmd.Process.Signal(tc.signal); err != nil {
					t.Fatal(err)
				}
			}
			if got := exitOf(t, cmd); got != tc.want {
				t.Fatalf("init exited %d, want %d", got, tc.want)
			}
		})
	}
}

// TestInitReapsOrphans: a process orphaned below the init (its parent, a child of the
// entrypoint, exited) is reaped by the init once it exits: it leaves no zombie.
func TestInitReapsOrphans(t *testing.T) {
	cmd, out, closeStdin := startInit(t, `sh -c 'sleep 1000 & echo $!'; echo ready; read x; exit 5`)
	var orphan int
	if _, err := fmt.Sscan(readLine(t, out), &orphan); err != nil {
		t.Fatal(err)
	}
	if got := readLine(t, out); got != "ready" {
		t.Fatalf("entrypoint printed %q", got)
	}
	if ppid := parentPid(t, orphan); ppid != cmd.Process.Pid {
		t.Fatalf("the orphan's parent is %d, want the init %d", ppid, cmd.Process.Pid)
	}
	if err := syscall.Kill(orphan, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", orphan))
		if err != nil {
			break // reaped
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphan %d is still there: %s", orphan, data)
		}
		time.Sleep(10 * time.Millisecond)
	}
	closeStdin()
	if got := exitOf(t, cmd); got != 5 {
		t.Fatalf("init exited %d, want the entrypoint's 5", got)
	}
}

func parentPid(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid ...
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	var ppid int
	if _, err := fmt.Sscan(fields[1], &ppid); err != nil {
		t.Fatal(err)
	}
	return ppid
}

// TestInitExitPastSignalFlood: the entrypoint exits in the middle of a flood of signals sent
// faster than the init forwards them, and the init still sees it. os/signal drops a signal whose
// channel is full, which a SIGCHLD on the forwarded signals' channel was: the init then waited for
// ever. The flood has many signal numbers (the runtime keeps one of each pending), comes from
// several senders, and is bounded: the init catches up once it ends.
func TestInitExitPastSignalFlood(t *testing.T) {
	flood := []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH}
	for s := syscall.Signal(35); s <= 60; s++ { // real-time signals
		flood = append(flood, s)
	}
	ignore := ""
	for _, s := range flood {
		ignore += fmt.Sprintf(" %d", s)
	}
	cmd, out, closeStdin := startInit(t, "trap ''"+ignore+"; echo ready; read x; exit 6")
	if got := readLine(t, out); got != "ready" {
		t.Fatalf("entrypoint printed %q", got)
	}
	// Each sender sends half its signals before the entrypoint is let go, half after.
	const senders, each = 4, 3000
	var halfway, finished sync.WaitGroup
	halfway.Add(senders)
	finished.Add(senders)
	for range senders {
		go func() {
			defer finished.Done()
			for n := range each {
				if n == each/2 {
					halfway.Done()
				}
				// Process.Signal goes through a pidfd: it cannot reach a process that reused the
				// pid. A full queue of real-time signals (EAGAIN) skips one.
				if errors.Is(cmd.Process.Signal(flood[n%len(flood)]), os.ErrProcessDone) {
					return
				}
			}
		}()
	}
	halfway.Wait()
	closeStdin()
	got := exitOf(t, cmd)
	finished.Wait()
	if got != 6 {
		t.Fatalf("init exited %d under a signal flood, want the entrypoint's 6", got)
	}
}

// TestSuperviseFullQueue: a SIGCHLD delivered as os/signal delivers it, to each channel that
// has room, ends the init's supervision with the entrypoint's status while the forwarded
// signals' channel is full.
func TestSuperviseFullQueue(t *testing.T) {
	child, err := startEntrypoint([]string{"sh", "-c", "exit 9"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the exit without reaping it: the pid stays the entrypoint's.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, child, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	sigs, chld := make(chan os.Signal, 64), make(chan os.Signal, 1)
	for len(sigs) < cap(sigs) {
		sigs <- syscall.SIGWINCH
	}
	for _, c := range []chan os.Signal{sigs, chld} {
		select {
		case c <- syscall.SIGCHLD:
		default: // dropped, as os/signal drops it
		}
	}
	if got := supervise(child, sigs, chld); got != 9 {
		t.Fatalf("supervise returned %d, want the entrypoint's 9", got)
	}
}

// TestInitMissingEntrypoint: an entrypoint that cannot be run ends the init with 127.
func TestInitMissingEntrypoint(t *testing.T) {
	cmd := exec.Command(os.Args[0], "--", "no-such-program-here")
	cmd.Env = append(os.Environ(), initEnv+"=1")
	out, _ := cmd.CombinedOutput()
	if got := cmd.ProcessState.ExitCode(); got != 127 || !strings.Contains(string(out), "no-such-program-here") {
		t.Fatalf("init of a missing program: exit %d, %q; want 127 naming it", got, out)
	}
}

func TestIsInit(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{InitPath, "--", "sleep", "1"}, true},
		{[]string{InitPath, "--"}, true},
		{[]string{InitPath, "sleep"}, false},
		{[]string{"/proc/self/fd/3", "--", "sleep"}, false},
		{[]string{InitPath}, false},
	} {
		if got := IsInit(tc.args); got != tc.want {
			t.Errorf("IsInit(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

// TestInitTerminal: an init that leads the session of a terminal hands it over: the entrypoint
// leads a session of its own with the terminal as its controlling one and its group in the
// foreground, and is not hung up by the hand-over.
func TestInitTerminal(t *testing.T) {
	master, slave := openPty(t)
	cmd := exec.Command(os.Args[0], "--", "sh", "-c",
		`read -r pid comm state ppid pgrp sid ttynr tpgid rest < /proc/$$/stat; echo "entrypoint $pid $sid $tpgid"`)
	cmd.Env = append(os.Environ(), initEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	out := bufio.NewReader(master)
	var line string
	for !strings.HasPrefix(line, "entrypoint ") {
		var err error
		if line, err = out.ReadString('\n'); err != nil {
			t.Fatalf("read the terminal: %v (last line %q)", err, line)
		}
	}
	var pid, sid, tpgid int
	if _, err := fmt.Sscan(strings.TrimPrefix(line, "entrypoint "), &pid, &sid, &tpgid); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	if sid != pid || tpgid != pid {
		t.Fatalf("entrypoint %d: session %d, terminal's foreground group %d; want both its own", pid, sid, tpgid)
	}
	if got := exitOf(t, cmd); got != 0 {
		t.Fatalf("init exited %d, want the entrypoint's 0", got)
	}
}

// openPty opens a new pty pair (/dev/ptmx).
func openPty(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Close() })
	var unlock int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		t.Fatal(errno)
	}
	n, err := ioctlInt(int(master.Fd()), syscall.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return master, slave
}
