package integration

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/docker/go-units"
)

// storedView is what `checkpoint ls|inspect --format json` says of a checkpoint's memory.
type storedView struct {
	ID                string `json:"id"`
	MemoryBytes       int64  `json:"memoryBytes"`
	MemoryStoredBytes *int64 `json:"memoryStoredBytes"`
}

// TestCLIListStored is issue 19's memory stored as what changed, as `cklite checkpoint ls` and
// `inspect` show it: a python process holding 16 MiB of random bytes is checkpointed, changes 1
// MiB, and is checkpointed again. Once the shim has deduplicated the second (pagechain.json), both
// are listed with the dump's size (memoryBytes, MEMORY: the whole 16 MiB each) and the disk their
// image directories take (memoryStoredBytes, STORED): the first a full dump, the second a small
// part of it; the table and inspect say the same as the JSON.
func TestCLIListStored(t *testing.T) {
	e := newCkEnv(t)
	const mib = 16
	c, _, p, start := e.memContainer(t, "stored", mib)
	var cks []pagesCheckpoint
	for step := 1; step <= 2; step++ {
		ck := e.pagesCheckpoint(t, c.ID(), p, step, start.token, mib)
		if r := waitReport(t, ck.dir); r.Skipped != "" && step == 2 {
			t.Fatalf("checkpoint 2 not deduplicated: %s", r.Skipped)
		}
		cks = append(cks, ck)
	}

	var listed []storedView
	if err := json.Unmarshal([]byte(cklite(t, e.d, "checkpoint", "ls", "--format", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	byID := map[string]storedView{}
	for _, v := range listed {
		byID[v.ID] = v
	}
	full, delta := byID[cks[0].id], byID[cks[1].id]
	for i, v := range []storedView{full, delta} {
		if v.MemoryBytes < mib<<20 || v.MemoryStoredBytes == nil {
			t.Fatalf("checkpoint %d (%s): memoryBytes %d, memoryStoredBytes %v: want the dump's size (%d MiB held) and the stored size", i+1, cks[i].id, v.MemoryBytes, v.MemoryStoredBytes, mib)
		}
	}
	if *full.MemoryStoredBytes < mib<<20 || *full.MemoryStoredBytes > full.MemoryBytes {
		t.Errorf("the first checkpoint, a full dump, stores %d bytes of its %d", *full.MemoryStoredBytes, full.MemoryBytes)
	}
	if *delta.MemoryStoredBytes > delta.MemoryBytes/4 {
		t.Errorf("the second checkpoint (1 MiB of %d changed) stores %d bytes of its %d", mib, *delta.MemoryStoredBytes, delta.MemoryBytes)
	}

	table := cklite(t, e.d, "checkpoint", "ls")
	t.Logf("cklite checkpoint ls:\n%s", table)
	for i, v := range []storedView{full, delta} {
		memory, stored := lsSizes(t, table, v.ID)
		if want := units.HumanSizeWithPrecision(float64(v.MemoryBytes), 3); memory != want {
			t.Errorf("checkpoint %d: MEMORY %s, want %s", i+1, memory, want)
		}
		if want := units.HumanSizeWithPrecision(float64(*v.MemoryStoredBytes), 3); stored != want {
			t.Errorf("checkpoint %d: STORED %s, want %s", i+1, stored, want)
		}
	}

	var inspected []storedView
	if err := json.Unmarshal([]byte(cklite(t, e.d, "checkpoint", "inspect", delta.ID)), &inspected); err != nil {
		t.Fatal(err)
	}
	if len(inspected) != 1 || inspected[0].MemoryStoredBytes == nil || *inspected[0].MemoryStoredBytes != *delta.MemoryStoredBytes {
		t.Errorf("inspect %s: %+v, want memoryStoredBytes %d as ls says", delta.ID, inspected, *delta.MemoryStoredBytes)
	}
}

// lsSizes is the MEMORY and STORED cells of checkpoint id's line of `checkpoint ls` (its id, NAME,
// CONTAINER and AGE come first; none of them has a blank here).
func lsSizes(t *testing.T, table, id string) (string, string) {
	t.Helper()
	for _, l := range strings.Split(table, "\n") {
		f := strings.Fields(l)
		for i, cell := range f {
			if cell == id && len(f) > i+5 {
				return f[i+4], f[i+5]
			}
		}
	}
	t.Fatalf("no line of checkpoint %s with its sizes in:\n%s", id, table)
	return "", ""
}
