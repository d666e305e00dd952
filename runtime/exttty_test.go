package runtime

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestTtyNames: CRIU's name of a terminal is the same whether read from the shim's file or from a
// process's fd, a pipe has none, and only names of that form pass IsTtyName (they come back from
// a checkpoint's image directory, maybe from elsewhere).
func TestTtyNames(t *testing.T) {
	master, slave, err := NewTty()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	defer slave.Close()
	name := TtyName(slave)
	if !IsTtyName(name) {
		t.Fatalf("TtyName of a pty slave: %q", name)
	}
	if got := ptySlaveName(os.Getpid(), int(slave.Fd())); got != name {
		t.Fatalf("ptySlaveName of the slave: %q, want %q", got, name)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if got := ptySlaveName(os.Getpid(), int(r.Fd())); got != "" {
		t.Fatalf("ptySlaveName of a pipe: %q, want none", got)
	}
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"tty[8803:1a]", true},
		{"tty[500:5]", true},
		{"tty[8803:1a]\nexternal mnt[]", false},
		{"tty[88O3:1a]", false},
		{"/dev/pts/3", false},
		{"pipe:[12]", false},
	} {
		if got := IsTtyName(tc.name); got != tc.ok {
			t.Errorf("IsTtyName(%q) = %v, want %v", tc.name, got, tc.ok)
		}
	}
	if got := ExternalTty(name); got != "external "+name {
		t.Fatalf("ExternalTty(%q) = %q", name, got)
	}
}

// TestDevTtyAliases: shells each leading a session on a pty of their own and holding /dev/tty
// open. /dev/tty in an exec's session stands for that exec's terminal; in a session that is no
// exec's it needs nothing; in two sessions one of which is an exec's it is refused, naming both.
func TestDevTtyAliases(t *testing.T) {
	a, aTty := shellOnTty(t)
	b, bTty := shellOnTty(t)
	for _, tc := range []struct {
		name     string
		pids     []int
		sessions map[int]string
		want     int // aliases, -1 for a refusal
	}{
		{"an exec's", []int{a}, map[int]string{a: aTty}, 1},
		{"no exec's", []int{a}, nil, 0},
		{"not held", []int{os.Getpid()}, map[int]string{os.Getpid(): aTty}, 0},
		{"two execs'", []int{a, b}, map[int]string{a: aTty, b: bTty}, -1},
		{"an exec's and another", []int{a, b}, map[int]string{b: bTty}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			aliases, err := DevTtyAliases(tc.pids, tc.sessions)
			if tc.want < 0 {
				if err == nil || !strings.Contains(err.Error(), strconv.Itoa(a)) || !strings.Contains(err.Error(), strconv.Itoa(b)) {
					t.Fatalf("aliases %v, error %v; want a refusal naming %d and %d", aliases, err, a, b)
				}
				return
			}
			if err != nil || len(aliases) != tc.want {
				t.Fatalf("aliases %v, %v; want %d", aliases, err, tc.want)
			}
			for devTty, tty := range aliases {
				if !IsTtyName(devTty) || tty != aTty {
					t.Fatalf("alias %s -> %s, want /dev/tty -> %s", devTty, tty, aTty)
				}
			}
		})
	}
}

// shellOnTty starts a shell leading its session on a new pty, holding /dev/tty open; it returns
// its pid and its terminal's name.
func shellOnTty(t *testing.T) (int, string) {
	t.Helper()
	master, slave, err := NewTty()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Close() })
	cmd := exec.Command("/bin/sh", "-c", "exec 3<>/dev/tty; echo ready; read x")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	name := TtyName(slave)
	slave.Close()
	out := bufio.NewReader(master)
	for {
		line, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("shell on a pty: %v", err)
		}
		if strings.TrimSpace(line) == "ready" {
			return cmd.Process.Pid, name
		}
	}
}
