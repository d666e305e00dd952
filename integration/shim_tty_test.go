package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/integration/harness"
)

// TestShimRunInteractive is `nerdctl run -it` on a real terminal: the container's shell gets a
// pty of its own, starts at the size of nerdctl's terminal, follows a resize (nerdctl forwards
// SIGWINCH to the shim's ResizePty), and its exit code becomes nerdctl's.
func TestShimRunInteractive(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		s := startTerminal(t, d, 30, 100, "run", "-it", "--rm", "--runtime", rt, "--net", "none", busybox.Name, "sh")
		checkTerminal(t, s)
		s.send(t, "exit 5")
		if code := s.wait(t); code != 5 {
			t.Fatalf("nerdctl run -it exited %d after the shell's `exit 5`; the terminal shows:\n%s", code, s.shows())
		}
	})
}

// TestShimExecInteractive is `nerdctl exec -it`: the exec process gets its own pty, sized and
// resized like the init's.
func TestShimExecInteractive(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		d := shimDaemon(t)
		runDetached(t, d, rt, "box", nil, "sleep", "3600")
		s := startTerminal(t, d, 30, 100, "exec", "-it", "box", "sh")
		checkTerminal(t, s)
		s.send(t, "exit 6")
		// nerdctl 2.2 exits 1 whatever the exec's code, and reports the code.
		if code := s.expect(t, execExitRE)[1]; code != "6" {
			t.Fatalf("nerdctl exec -it reported exit code %s after the shell's `exit 6`", code)
		}
		if code := s.wait(t); code == 0 {
			t.Fatal("nerdctl exec -it exited 0 after the shell's `exit 6`")
		}
	})
}

var (
	ttyRE  = regexp.MustCompile(`TTY=(\S+)`)
	sizeRE = regexp.MustCompile(`SIZE=(\d+ \d+)`)
	// execExitRE is how nerdctl exec reports a non-zero exit code of the exec'd process.
	execExitRE = regexp.MustCompile(`exec failed with exit code (\d+)`)
)

// checkTerminal checks the shell in s runs on a pty of the container sized 30x100 as the session
// started, then resizes the session's terminal and checks the shell sees the new size.
func checkTerminal(t *testing.T, s *terminal) {
	t.Helper()
	// The markers are split in the command line so that its echo does not match.
	s.send(t, `echo "T""TY=$(tty)"`)
	if tty := s.expect(t, ttyRE)[1]; !regexp.MustCompile(`^/dev/pts/\d+$`).MatchString(tty) {
		t.Fatalf("tty in the container printed %q, want /dev/pts/N", tty)
	}
	s.send(t, `echo "SI""ZE=$(stty size)"`)
	if size := s.expect(t, sizeRE)[1]; size != "30 100" {
		t.Fatalf("stty size in the container printed %q, want the terminal's 30 100", size)
	}
	s.resize(t, 40, 120)
	// SIGWINCH reaches nerdctl asynchronously: ask until the new size shows.
	eventually(t, "the container's terminal to be resized to 40x120", func() error {
		s.send(t, `echo "SI""ZE=$(stty size)"`)
		if size := s.expect(t, sizeRE)[1]; size != "40 120" {
			return fmt.Errorf("stty size printed %q", size)
		}
		return nil
	})
}

// terminal is a nerdctl process whose controlling terminal is a pty the test holds the master of.
type terminal struct {
	master *os.File
	cmd    *exec.Cmd
	done   chan struct{} // closed when the process has exited and all its output is read

	mu   sync.Mutex
	out  bytes.Buffer
	seen int // out[:seen] has been matched by expect already
}

// startTerminal starts nerdctl args on a new pty of rows x cols, as its session leader's
// controlling terminal, the way a shell runs it.
func startTerminal(t *testing.T, d *harness.Daemon, rows, cols int, args ...string) *terminal {
	t.Helper()
	return startOnTerminal(t, d.Command(context.Background(), "nerdctl", args...), rows, cols)
}

// startOnTerminal starts cmd as startTerminal starts nerdctl.
func startOnTerminal(t *testing.T, cmd *exec.Cmd, rows, cols int) *terminal {
	t.Helper()
	master, slave, err := openPty()
	if err != nil {
		t.Fatal(err)
	}
	s := &terminal{master: master, done: make(chan struct{})}
	s.resize(t, rows, cols)
	s.cmd = cmd
	s.cmd.Stdin, s.cmd.Stdout, s.cmd.Stderr = slave, slave, slave
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := s.cmd.Start(); err != nil {
		master.Close()
		slave.Close()
		t.Fatal(err)
	}
	// Only nerdctl holds the slave now: once it exits, reads of the master end with EIO.
	slave.Close()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			s.mu.Lock()
			s.out.Write(buf[:n])
			s.mu.Unlock()
			if err != nil {
				break
			}
		}
		_ = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
		master.Close()
	})
	return s
}

// send types line and Enter.
func (s *terminal) send(t *testing.T, line string) {
	t.Helper()
	if _, err := s.master.Write([]byte(line + "\n")); err != nil {
		t.Fatalf("writing to the terminal: %v", err)
	}
}

// expect waits for output matching re after what earlier calls matched, and returns the submatches.
func (s *terminal) expect(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Checked before matching: once done is closed, all the output is in.
		exited := false
		select {
		case <-s.done:
			exited = true
		default:
		}
		if m := s.match(re); m != nil {
			return m
		}
		switch {
		case exited:
			t.Fatalf("nerdctl exited (%v) without output matching %s; the terminal shows:\n%s", s.cmd.ProcessState, re, s.shows())
		case time.Now().After(deadline):
			t.Fatalf("no output matching %s on the terminal; it shows:\n%s", re, s.shows())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// match returns the submatches of re in the output not matched yet, and consumes them.
func (s *terminal) match(re *regexp.Regexp) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.out.Bytes()[s.seen:]
	loc := re.FindSubmatchIndex(out)
	if loc == nil {
		return nil
	}
	var m []string
	for i := 0; i < len(loc); i += 2 {
		m = append(m, string(out[loc[i]:loc[i+1]]))
	}
	s.seen += loc[1]
	return m
}

// shows is everything the terminal has shown, for failure messages.
func (s *terminal) shows() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// resize sets the terminal's size, which signals SIGWINCH to its foreground process group.
func (s *terminal) resize(t *testing.T, rows, cols int) {
	t.Helper()
	if err := ioctl(s.master, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	}); err != nil {
		t.Fatalf("resizing the terminal: %v", err)
	}
}

// wait waits for nerdctl to exit and returns its exit code.
func (s *terminal) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("nerdctl did not exit; the terminal shows:\n%s", s.shows())
	}
	return s.cmd.ProcessState.ExitCode()
}

// openPty opens a new pseudo-terminal pair from /dev/ptmx.
func openPty() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var n int
	err = ioctl(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlocking the pty: %w", err)
		}
		n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN)
		return err
	})
	if err == nil {
		slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// ioctl runs fn on f's descriptor without f.Fd(), which would put it in blocking mode.
func ioctl(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
