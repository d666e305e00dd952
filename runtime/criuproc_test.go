package runtime

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cklite/cklite/pkg/criuwrap"
)

// TestMain lets this test binary play the two other processes of TestCRIUDiesWithShim: the
// wrapper (run as "criu") and a shim that starts "criu" and is then killed; and CRIU's service
// for the dump driver's tests (fakeCRIU).
func TestMain(m *testing.M) {
	if out := os.Getenv(fakeCRIUEnv); out != "" && filepath.Base(os.Args[0]) == criuwrap.Name {
		os.Exit(fakeCRIU(out))
	}
	if criuwrap.Is() {
		err := criuwrap.Run()
		println(err.Error())
		os.Exit(1)
	}
	if dir := os.Getenv("CKLITE_TEST_SHIM"); dir != "" {
		os.Exit(fakeShim(dir))
	}
	os.Exit(m.Run())
}

// fakeShim installs the wrapper in dir, starts "criu 1000" from PATH, prints its pid and waits
// to be killed.
func fakeShim(dir string) int {
	self, err := os.Executable()
	if err != nil {
		println(err.Error())
		return 1
	}
	if err := InstallCRIUWrapper(dir, self); err != nil {
		println(err.Error())
		return 1
	}
	cmd := exec.Command("criu", "1000")
	if err := cmd.Start(); err != nil {
		println(err.Error())
		return 1
	}
	os.Stdout.WriteString(strconv.Itoa(cmd.Process.Pid) + "\n")
	select {}
}

// TestCRIUDiesWithShim: a "criu" started through the wrapper (here /bin/sleep standing in for
// CRIU) is killed when the shim that started it is (issue 16 item 3).
func TestCRIUDiesWithShim(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	fake := t.TempDir()
	if err := os.Symlink(sleep, filepath.Join(fake, "criu")); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	shim := exec.Command(self)
	shim.Env = append(os.Environ(), "CKLITE_TEST_SHIM="+filepath.Join(t.TempDir(), "wrapper"), "PATH="+fake+":"+os.Getenv("PATH"))
	out, err := shim.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := shim.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = shim.Process.Kill()
		t.Fatalf("the fake shim printed no pid: %v", err)
	}
	criu, _ := strconv.Atoi(line[:len(line)-1])
	// The wrapper execs the real criu once it has set its parent-death signal.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		exe, err := os.Readlink("/proc/" + strconv.Itoa(criu) + "/exe")
		if err == nil && filepath.Base(exe) == filepath.Base(sleep) {
			break
		}
		if time.Now().After(deadline) {
			_ = shim.Process.Kill()
			t.Fatalf("the wrapper runs %q (%v) after 10 s, want the real criu (here %s)", exe, err, sleep)
		}
	}
	if err := unix.Kill(shim.Process.Pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = shim.Wait()
	for deadline := time.Now().Add(10 * time.Second); anyAlive([]int{criu}); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = unix.Kill(criu, unix.SIGKILL)
			t.Fatalf("criu %d outlived its shim by 10 s", criu)
		}
	}
}
