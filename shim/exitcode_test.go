package shim

import (
	"syscall"
	"testing"
)

func TestWaitStatusCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		ws   syscall.WaitStatus
		want int
	}{
		{"exit 0", 0, 0},
		{"exit 3", 3 << 8, 3},
		{"exit 255", 255 << 8, 255},
		{"SIGKILL", syscall.WaitStatus(syscall.SIGKILL), 137},
		{"SIGTERM", syscall.WaitStatus(syscall.SIGTERM), 143},
		{"SIGKILL with core flag", syscall.WaitStatus(syscall.SIGSEGV) | 0x80, 128 + int(syscall.SIGSEGV)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := waitStatusCode(tc.ws); got != tc.want {
				t.Fatalf("got %d, want %d", got, tc.want)
			}
		})
	}
	if exitCode(nil) != exitCodeUnknown {
		t.Fatal("nil state must be unknown")
	}
}
