package fault

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		spec string
		name string
		n    int
		hold bool
	}{
		{"switch-prepared", "switch-prepared", 1, false},
		{"switch-prepared:3", "switch-prepared", 3, false},
		{"shim-after-dump:hold", "shim-after-dump", 1, true},
		{"shim-after-dump:2:hold", "shim-after-dump", 2, true},
		{"x:0", "x", 1, false},
		{"x:many", "x", 1, false},
	} {
		name, n, hold := parse(tc.spec)
		if name != tc.name || n != tc.n || hold != tc.hold {
			t.Errorf("parse(%q) = %q, %d, %v; want %q, %d, %v", tc.spec, name, n, hold, tc.name, tc.n, tc.hold)
		}
	}
}

// TestPoint runs this test binary as a process that reaches point "p" three times, printing the
// hit before each: armed with p:2 it must die of SIGKILL at the second, unarmed or armed at
// another point it must not.
func TestPoint(t *testing.T) {
	if os.Getenv("FAULT_TEST_CHILD") != "" {
		for i := 1; i <= 3; i++ {
			fmt.Println(i)
			Point("p")
		}
		os.Exit(0)
	}
	for _, tc := range []struct {
		env    string
		out    string
		killed bool
	}{
		{"", "1\n2\n3\n", false},
		{Env + "=other:1", "1\n2\n3\n", false},
		{Env + "=p:2", "1\n2\n", true},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPoint$")
		cmd.Env = append(os.Environ(), "FAULT_TEST_CHILD=1", tc.env)
		out, err := cmd.Output()
		var exit *exec.ExitError
		killed := errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
		if string(out) != tc.out || killed != tc.killed {
			t.Errorf("with %q: printed %q, killed %v (%v); want %q, killed %v", tc.env, out, killed, err, tc.out, tc.killed)
		}
	}
}
