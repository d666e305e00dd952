package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// TestProcOutlivesTheStartingThread: a process the harness starts keeps running when the
// goroutine that asked for it exits locked to its thread (the kernel's death signal follows the
// forking thread, and Go ends a thread whose locked goroutine returns).
func TestProcOutlivesTheStartingThread(t *testing.T) {
	var p *proc
	tid := onExitingThread(func() {
		var err error
		if p, err = startProc("sleep", filepath.Join(t.TempDir(), "sleep.log"), nil, "/bin/sleep", "60"); err != nil {
			t.Error(err)
		}
	})
	if p == nil {
		return
	}
	defer p.stop(time.Second) //nolint:errcheck
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d did not exit: the test proves nothing", tid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-p.done:
		t.Fatalf("the process died with the thread that started it: %v", p.err)
	case <-time.After(200 * time.Millisecond):
	}
}

// onExitingThread runs f on an OS thread that ends when f returns, and returns that thread's id.
// The main thread never ends, so a goroutine that finds itself there holds it until f is done
// and tries again on another.
func onExitingThread(f func()) (tid int) {
	done := make(chan int)
	var try func()
	try = func() {
		runtime.LockOSThread() // never unlocked where f runs: the thread ends with the goroutine
		if syscall.Gettid() == os.Getpid() {
			go try()
			done <- <-done // hold the main thread until f is done
			runtime.UnlockOSThread()
			return
		}
		f()
		done <- syscall.Gettid()
	}
	go try()
	return <-done
}
