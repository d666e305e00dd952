package integration

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
)

// TestCLINerdctlCheckpoint is issue 18 item 6: a checkpoint `nerdctl checkpoint create` took of a
// cklite container records no image directory (nerdctl checkpoints through the daemon's temporary
// one and extracts the images into its own checkpoint directory), and cklite finds it there:
// rollback and fork take it by nerdctl's checkpoint name and by cklite's id.
func TestCLINerdctlCheckpoint(t *testing.T) {
	e := newCkEnv(t)
	id := runDetached(t, e.d, harness.CkliteRuntime, "web", []string{"--snapshotter", ckliteSnapshotter}, "sh", "-c", workload.CounterScript)
	waitForStatus(t, e.d, "web", "running")
	cnt := newCounter(e.d.RootfsPath(id))
	writeMarks(t, cnt.Rootfs, "ck1")
	at := cnt.advance(t, 3)
	mustNerdctl(t, e.d, "checkpoint", "create", "--leave-running", "web", "ck1")
	var listed []inspected
	if err := json.Unmarshal([]byte(cklite(t, e.d, "checkpoint", "ls", "--format", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0].Container != id || listed[0].ImagePath != "" {
		t.Fatalf("checkpoint ls after nerdctl checkpoint create: %+v; want one checkpoint of %s with no recorded image directory", listed, id)
	}
	ck := listed[0].ID

	for _, ref := range []string{"ck1", ck} {
		changeMarks(t, cnt.Rootfs, "ck1")
		cklite(t, e.d, "rollback", "web", ref)
		expectRolledBack(t, cnt, at, "ck1")
	}
	forkID := strings.TrimSpace(cklite(t, e.d, "fork", "-q", "ck1"))
	expectRolledBack(t, newCounter(e.d.RootfsPath(forkID)), at, "ck1")
}
