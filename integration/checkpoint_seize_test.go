package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
)

// TestCheckpointFrozenUntilCaptured: a leave-running checkpoint's memory and filesystem are of the
// same instant although the shim no longer freezes the task before the dump (issue 15: a CRIU with
// --leave-frozen freezes it at its seize and leaves it frozen for the capture). The task appends
// its counter to a file as fast as it can; after a rollback to a checkpoint the restored counter
// goes on where the captured file ends: every line is the one before plus one. A task thawed
// between the dump and the capture writes lines past the dumped counter into the checkpoint's
// layer, which the restored task then writes again (or CRIU refuses to restore a file whose size
// changed). The dump's CRIU configuration file asks CRIU to leave the cgroup it froze frozen
// exactly when the criu in PATH (the stack's, or a test build first in PATH) has leave_frozen:
// without it the shim freezes the task before the dump, as before.
func TestCheckpointFrozenUntilCaptured(t *testing.T) {
	e := newCkEnv(t)
	c := e.newContainer(t, "counter", e.img, oci.WithProcessArgs("sh", "-c", "i=0; while :; do i=$((i+1)); echo $i >>/count; done"))
	if _, err := startTask(e.ctx, c); err != nil {
		t.Fatal(err)
	}
	count := filepath.Join(e.d.RootfsPath(c.ID()), "count")
	grown := func(after int) {
		t.Helper()
		eventually(t, fmt.Sprintf("the counter to pass %d", after), func() error {
			if n := len(countLines(t, count)); n <= after {
				return fmt.Errorf("%d lines", n)
			}
			return nil
		})
	}
	grown(100)
	var ids []string
	for i := range 3 {
		ids = append(ids, e.timedCheckpoint(t, c.ID(), fmt.Sprint("counter-", i)))
		grown(len(countLines(t, count)) + 100)
	}
	has := e.d.Command(context.Background(), "criu", "check", "--feature", "leave_frozen").Run() == nil
	conf := filepath.Join(filepath.Dir(e.d.RootfsPath(c.ID())), "criu-dump", "cklite-criu.conf")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if asked := slices.Contains(strings.Fields(string(b)), "leave-frozen"); asked != has {
		t.Fatalf("CRIU has leave_frozen: %t; the dump's configuration asks for it: %t (%s: %q)", has, asked, conf, b)
	}

	cklite(t, e.d, "rollback", c.ID(), ids[1])
	at := len(countLines(t, count))
	grown(at + 100)
	lines := countLines(t, count)
	for i, l := range lines {
		if l != strconv.Itoa(i+1) {
			t.Fatalf("after a rollback to a checkpoint whose file held about %d lines, line %d is %q, want %d: the file was captured after the task ran on (lines %q)",
				at, i+1, l, i+1, lines[max(0, i-3):min(len(lines), i+3)])
		}
	}
}

// countLines reads the counter's file, complete lines only (the task may be writing the last).
func countLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	s := string(b)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return strings.Split(s[:i], "\n")
	}
	return nil
}
