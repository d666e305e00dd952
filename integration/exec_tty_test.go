package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/integration/harness"
)

// TestExecTerminalSurvivesCheckpoint: an interactive shell started with `nerdctl exec -it sh` on a
// pty the test holds is part of the checkpoint. A leave-running checkpoint (a dump that leaves
// the processes running) and one that stops and restores the task in place (the switch rule,
// past 64 MiB written) both leave the same shell answering on the same terminal: same pid in the
// container, its variable, the typed input echoed. After a rollback, and in a fork, the shell that
// ran at the checkpoint is back, with no client: the leader of its own session on a new terminal,
// it holds the variable as it was at the checkpoint, which it writes to a file when a command is
// typed into its terminal (TIOCSTI), after 1 MB of output nobody reads. A checkpoint of the
// rolled back task, and a rollback to it, bring it back again.
func TestExecTerminalSurvivesCheckpoint(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "exectty")
	s := startTerminal(t, e.d, 30, 100, "exec", "-it", c.ID(), "sh")
	old := "one-" + randomTag()
	s.send(t, "V="+old+`; echo "$V" >/tmp/tty-token; echo "SH""ELL=$$ V=$V"`)
	pid := expectShell(t, s, "", old)

	created := cklite(t, e.d, "checkpoint", "create", c.ID())
	m := createdID.FindStringSubmatch(created)
	if m == nil {
		t.Fatalf("cklite checkpoint create printed %q", created)
	}
	s.send(t, `echo "SH""ELL=$$ V=$V"`)
	expectShell(t, s, pid, old)

	// Past the switch rule the checkpoint stops the task and restores it in place: the shell
	// comes back on a new pty, which its console moves onto.
	big := filepath.Join(cnt.Rootfs, "big")
	if err := os.WriteFile(big, make([]byte, 65<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	cklite(t, e.d, "checkpoint", "create", c.ID())
	echo := ": typed-" + randomTag()
	s.send(t, echo)
	s.expect(t, regexp.MustCompile(regexp.QuoteMeta(echo)))
	s.send(t, `echo "SH""ELL=$$ V=$V"`)
	expectShell(t, s, pid, old)
	// The shell now runs on the new pty, which the next dump names.
	cklite(t, e.d, "checkpoint", "create", c.ID())
	s.send(t, `echo "SH""ELL=$$ V=$V"`)
	expectShell(t, s, pid, old)

	changed := "two-" + randomTag()
	s.send(t, "V="+changed+`; echo "$V" >/tmp/tty-token; echo "SH""ELL=$$ V=$V"`)
	expectShell(t, s, pid, changed)

	cklite(t, e.d, "rollback", c.ID(), m[1])
	hostPid := restoredShell(t, e, c.ID(), pid)
	if got := readToken(t, cnt.Rootfs, "tty-token"); got != old {
		t.Fatalf("/tmp/tty-token after the rollback: %q, want %q", got, old)
	}
	askVariable(t, hostPid, cnt.Rootfs, old)

	// The restored shell's terminal is a stand-in, which a checkpoint names too, and a rollback
	// to that checkpoint replaces with another.
	created = cklite(t, e.d, "checkpoint", "create", c.ID())
	again := createdID.FindStringSubmatch(created)
	if again == nil {
		t.Fatalf("cklite checkpoint create printed %q", created)
	}
	cklite(t, e.d, "rollback", c.ID(), again[1])
	askVariable(t, restoredShell(t, e, c.ID(), pid), cnt.Rootfs, old)

	forked := cklite(t, e.d, "fork", "-n", "1", m[1][:8])
	var names []string
	for _, l := range strings.Split(forked, "\n") {
		if sub := forkLineRE.FindStringSubmatch(l); sub != nil {
			names = append(names, sub[1])
		}
	}
	ids := forkIDsByName(t, e, names)
	if len(ids) != 1 {
		t.Fatalf("cklite fork -n 1 printed %q", forked)
	}
	askVariable(t, restoredShell(t, e, ids[0], pid), e.d.RootfsPath(ids[0]), old)
	if _, err := task.Status(e.ctx); err != nil {
		t.Fatal(err)
	}
}

var shellRE = regexp.MustCompile(`SHELL=(\d+) V=(\S*)`)

// expectShell reads the shell's answer on s and checks its pid in the container (unless pid is
// "") and its variable; it returns the pid.
func expectShell(t *testing.T, s *terminal, pid, v string) string {
	t.Helper()
	got := s.expect(t, shellRE)
	if pid != "" && got[1] != pid {
		t.Fatalf("the shell on the terminal has pid %s in the container, want %s (the same shell); the terminal shows:\n%s", got[1], pid, s.shows())
	}
	if got[2] != v {
		t.Fatalf("the shell's variable is %q, want %q; the terminal shows:\n%s", got[2], v, s.shows())
	}
	return got[1]
}

// restoredShell finds, among the processes of container id's task, the one whose pid in the
// container is pid, and checks it leads a session of its own on a terminal; it returns its host
// pid.
func restoredShell(t *testing.T, e *ckEnv, id, pid string) int {
	t.Helper()
	procs, err := e.taskOf(t, id).Pids(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid))
		if err != nil {
			continue
		}
		nspids := regexp.MustCompile(`(?m)^NSpid:\s+(.*)$`).FindStringSubmatch(string(status))
		if nspids == nil || !strings.HasSuffix(nspids[1], "\t"+pid) {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid))
		if err != nil {
			t.Fatal(err)
		}
		// Fields after the command: state ppid pgrp session tty_nr.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if f[3] != strconv.Itoa(int(p.Pid)) || f[4] == "0" {
			t.Fatalf("restored shell %d (pid %s in %s): session %s, tty %s; want the leader of its own session on a terminal", p.Pid, pid, id, f[3], f[4])
		}
		return int(p.Pid)
	}
	t.Fatalf("no process with pid %s in container %s after the restore (%d processes)", pid, id, len(procs))
	return 0
}

// askVariable types into the terminal of the shell hostPid a command that opens /dev/tty, writes
// 1 MB to the terminal, which nobody reads, then the shell's variable into /tmp/tty-v, and checks
// it is v.
func askVariable(t *testing.T, hostPid int, rootfs, v string) {
	t.Helper()
	answer := filepath.Join(rootfs, "tmp", "tty-v")
	if err := os.Remove(answer); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	tty, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/0", hostPid), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	// The shell opens /dev/tty too, as busybox's does for job control.
	for _, b := range []byte("exec 9<>/dev/tty; yes | head -c 1000000; echo \"$V\" >/tmp/tty-v\n") {
		if err := ioctl(tty, func(fd int) error {
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCSTI, uintptr(unsafe.Pointer(&b))); errno != 0 {
				return errno
			}
			return nil
		}); err != nil {
			t.Fatalf("typing into the restored shell's terminal (TIOCSTI): %v", err)
		}
	}
	eventually(t, "the restored shell to write its variable", func() error {
		got, err := os.ReadFile(answer)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(got)) != v {
			return fmt.Errorf("the restored shell's variable is %q, want %q", strings.TrimSpace(string(got)), v)
		}
		return nil
	})
}

// readToken reads /tmp/name in rootfs.
func readToken(t *testing.T, rootfs, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(rootfs, "tmp", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// TestExecTerminalsDevTty: CRIU knows /dev/tty by one name in a container, which a restore can
// give one terminal only. Two interactive busybox shells started with `nerdctl exec -it sh` each
// hold /dev/tty open: a checkpoint is refused, naming both shells by pid, and nothing is
// recorded. Once one of them exits, the checkpoint is taken and the other shell answers on.
func TestExecTerminalsDevTty(t *testing.T) {
	e := newCkEnv(t)
	c, _, _ := e.startCounter(t, "exectty2")
	var shells []*terminal
	var pids []string
	for i := range 2 {
		s := startTerminal(t, e.d, 30, 100, "exec", "-it", c.ID(), "sh")
		v := fmt.Sprintf("shell%d", i)
		s.send(t, "V="+v+`; echo "SH""ELL=$$ V=$V"`)
		pids = append(pids, expectShell(t, s, "", v))
		shells = append(shells, s)
	}
	before := cklite(t, e.d, "checkpoint", "ls", "-q")
	_, err := e.d.Cklite(context.Background(), "checkpoint", "create", c.ID())
	if err == nil || !strings.Contains(err.Error(), "hold /dev/tty open on two terminals") {
		t.Fatalf("checkpoint with two shells holding /dev/tty: %v, want it refused", err)
	}
	for _, pid := range pids {
		if !strings.Contains(err.Error(), "(pid "+pid+" in the container") {
			t.Fatalf("the refusal does not name shell %s: %v", pid, err)
		}
	}
	t.Logf("refused as expected: %v", err)
	if after := cklite(t, e.d, "checkpoint", "ls", "-q"); after != before {
		t.Fatalf("a refused checkpoint left checkpoints %q (before: %q)", after, before)
	}
	shells[1].send(t, "exit 0")
	shells[1].wait(t)
	cklite(t, e.d, "checkpoint", "create", c.ID())
	shells[0].send(t, `echo "SH""ELL=$$ V=$V"`)
	expectShell(t, shells[0], pids[0], "shell0")
}

// TestExecTerminalBesideInitTerminal: a task on a terminal (`nerdctl run -it sh`, whose pty CRIU
// restores through orphan-pts-master) and an exec on another (`ctr tasks exec --tty`, a loop
// reading lines, which holds no /dev/tty: only the init's shell does) are checkpointed together: a
// leave-running checkpoint and one past the switch rule leave both sessions answering, same pids
// in the container; after a rollback the init's session answers with the variable of the
// checkpoint.
func TestExecTerminalBesideInitTerminal(t *testing.T) {
	e := newCkEnv(t)
	const name = "ttyinit"
	sh := startTerminal(t, e.d, 30, 100, "run", "-it", "--snapshotter", ckliteSnapshotter, "--runtime", harness.CkliteRuntime,
		"--net", "none", "--name", name, busybox.Name, "sh")
	old := "init-" + randomTag()
	sh.send(t, "V="+old+`; echo "SH""ELL=$$ V=$V"`)
	initPid := expectShell(t, sh, "", old)
	id := inspect(t, e.d, name, "{{.ID}}")
	loop := startOnTerminal(t, e.d.Command(context.Background(), "ctr", "--address", e.d.Address, "--namespace", e.d.Namespace,
		"tasks", "exec", "--tty", "--exec-id", "loop", id, "sh", "-c", `while read -r l; do echo "GOT=$l $$"; done`), 30, 100)
	loopPid := expectLine(t, loop, "")

	m := createdID.FindStringSubmatch(cklite(t, e.d, "checkpoint", "create", id))
	if m == nil {
		t.Fatal("cklite checkpoint create printed no checkpoint id")
	}
	expectLine(t, loop, loopPid)
	sh.send(t, `echo "SH""ELL=$$ V=$V"`)
	expectShell(t, sh, initPid, old)

	if err := os.WriteFile(filepath.Join(e.d.RootfsPath(id), "big"), make([]byte, 65<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	cklite(t, e.d, "checkpoint", "create", id)
	expectLine(t, loop, loopPid)
	sh.send(t, `V=changed; echo "SH""ELL=$$ V=$V"`)
	expectShell(t, sh, initPid, "changed")

	cklite(t, e.d, "rollback", id, m[1])
	sh.send(t, `echo "SH""ELL=$$ V=$V"`)
	expectShell(t, sh, initPid, old)
}

var gotRE = regexp.MustCompile(`GOT=(\w+) (\d+)`)

// expectLine types a fresh word into the loop's terminal and checks the loop echoes it, from pid
// (unless ""); it returns the loop's pid.
func expectLine(t *testing.T, s *terminal, pid string) string {
	t.Helper()
	word := "w" + randomTag()
	s.send(t, word)
	got := s.expect(t, gotRE)
	if got[1] != word || pid != "" && got[2] != pid {
		t.Fatalf("the exec'd loop answered %q, want %s from pid %s; the terminal shows:\n%s", got[0], word, pid, s.shows())
	}
	return got[2]
}
