package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/criuimage"
	"github.com/cklite/cklite/pkg/fault"
	"github.com/cklite/cklite/pkg/pagechain"
)

// memScript holds MIB MiB of random bytes in a python3 process and changes 1 MiB of them per step.
// /tmp/go asks for steps; /tmp/mem is "TOKEN STEP SHA256" after each; writing a nonce to /tmp/ask
// makes it answer "NONCE TOKEN STEP SHA256" in /tmp/answer, from its memory as it is then: what
// a restored process answers is its restored memory, whatever the restored files say.
const memScript = `import os, hashlib, time, uuid
tok, mib, step, asked = uuid.uuid4().hex, int(os.environ["MIB"]), 0, ""
b = bytearray(os.urandom(mib << 20))
def put(name, s):
    open("/tmp/" + name + ".new", "w").write(s)
    os.rename("/tmp/" + name + ".new", "/tmp/" + name)
def state():
    return "%s %d %s" % (tok, step, hashlib.sha256(b).hexdigest())
put("mem", state())
while True:
    try: want = int(open("/tmp/go").read())
    except Exception: want = step
    while step < want:
        step += 1
        off = (step * 7 % mib) << 20
        b[off:off + (1 << 20)] = os.urandom(1 << 20)
        put("mem", state())
    try: a = open("/tmp/ask").read().strip()
    except Exception: a = asked
    if a != asked:
        asked = a
        put("answer", a + " " + state())
    time.sleep(0.01)
`

// memState is what memScript reports.
type memState struct {
	token string
	step  int
	sum   string
}

// memProc drives memScript through a container's rootfs as the host sees it.
type memProc struct{ rootfs string }

func (p memProc) write(t *testing.T, name, s string) {
	t.Helper()
	tmp := filepath.Join(p.rootfs, "tmp", "."+name+".host")
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(p.rootfs, "tmp", name)); err != nil {
		t.Fatal(err)
	}
}

// wait polls file name until it parses and ok holds.
func (p memProc) wait(t *testing.T, what, name string, ok func([]string) bool) []string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		data, err := os.ReadFile(filepath.Join(p.rootfs, "tmp", name))
		if err == nil {
			last = strings.TrimSpace(string(data))
			if f := strings.Fields(last); ok(f) {
				return f
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("waiting for %s in %s: last read %q", what, name, last)
	return nil
}

func parseState(t *testing.T, f []string) memState {
	t.Helper()
	n, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("step %q: %v", f[1], err)
	}
	return memState{token: f[0], step: n, sum: f[2]}
}

// stepTo asks for step n and returns the state the process reports at it.
func (p memProc) stepTo(t *testing.T, n int) memState {
	t.Helper()
	p.write(t, "go", strconv.Itoa(n))
	return parseState(t, p.wait(t, fmt.Sprintf("step %d", n), "mem", func(f []string) bool { return len(f) == 3 && f[1] == strconv.Itoa(n) }))
}

// ask has the process report its memory now.
func (p memProc) ask(t *testing.T) memState {
	t.Helper()
	nonce := randomTag()
	p.write(t, "ask", nonce)
	return parseState(t, p.wait(t, "an answer to "+nonce, "answer", func(f []string) bool { return len(f) == 4 && f[0] == nonce })[1:])
}

// expect asks the process for its memory and checks it is want.
func (p memProc) expect(t *testing.T, what string, want memState) {
	t.Helper()
	if got := p.ask(t); got != want {
		t.Fatalf("%s: the process answers %+v, want %+v", what, got, want)
	}
}

// pagesCheckpoint is one checkpoint of TestPagesDedup and the process's state in it.
type pagesCheckpoint struct {
	id, dir string
	state   memState
}

// TestPagesDedup is issue 19's memory that grows with what changed: a python process holding 64
// MiB (CKLITE_PAGES_MIB) changes 1 MiB per step and is checkpointed with `cklite checkpoint
// create` after each of 5 steps. Each checkpoint after the first is stored as what changed since
// the one before (pagechain.json, the parent link) and takes a small part of a full dump on disk;
// each rolls back in place to exactly its memory (token, step and checksum of the 64 MiB); a fork
// of the last has its memory; `checkpoint rm --image` of a middle one, and `checkpoint prune
// --orphaned` of another's directory, leave the others restorable; the last one exported as a
// checkpoint image restores from it. With
// CKLITE_PAGES_DEDUP=off the shim keeps full dumps: the same test then measures the baseline;
// CKLITE_PAGES_ROUNDS=N measures rollback latency, full dump against chain.
func TestPagesDedup(t *testing.T) {
	e := newCkEnv(t)
	mib := envInt(t, "CKLITE_PAGES_MIB", 64, 8)
	dedup := os.Getenv("CKLITE_PAGES_DEDUP") != "off"
	if !dedup {
		if err := e.d.SetShimConfig("dedup_memory = false\n"); err != nil {
			t.Fatal(err)
		}
	}
	c, _, p, start := e.memContainer(t, "pages", mib)

	var cks []pagesCheckpoint
	for step := 1; step <= 5; step++ {
		ck := e.pagesCheckpoint(t, c.ID(), p, step, start.token, mib)
		r := waitReport(t, ck.dir)
		t.Logf("checkpoint %d (%s): du %s, pagechain %+v", step, ck.id, mibs(du(t, ck.dir)), r)
		p.expect(t, fmt.Sprintf("after checkpoint %d", step), ck.state)
		cks = append(cks, ck)
	}
	checkDisk(t, cks, mib, dedup)

	t.Run("rollback to each", func(t *testing.T) {
		for _, i := range []int{0, 4, 1, 3, 2} {
			began := time.Now()
			cklite(t, e.d, "rollback", c.ID(), cks[i].id)
			logTiming(t, fmt.Sprintf("cklite rollback to checkpoint %d (%d parents), %d MiB", i+1, parents(t, cks[i].dir), mib), began)
			p.expect(t, fmt.Sprintf("rolled back to checkpoint %d", i+1), cks[i].state)
		}
	})

	// CKLITE_PAGES_ROUNDS=N: N rollbacks to the first checkpoint (a full dump) and to the last
	// (its chain), alternately, for the medians of both (logged, not asserted).
	if n := envInt(t, "CKLITE_PAGES_ROUNDS", 0, 0); n > 0 {
		t.Run("rollback latency", func(t *testing.T) {
			took := map[int][]time.Duration{}
			for range n {
				for _, i := range []int{0, len(cks) - 1} {
					began := time.Now()
					cklite(t, e.d, "rollback", c.ID(), cks[i].id)
					took[i] = append(took[i], time.Since(began))
					p.expect(t, fmt.Sprintf("rolled back to checkpoint %d", i+1), cks[i].state)
				}
			}
			for i, d := range took {
				slices.Sort(d)
				t.Logf("rollback to checkpoint %d (%d parents), %d MiB: median of %d %v (min %v, max %v)",
					i+1, parents(t, cks[i].dir), mib, n, d[n/2].Round(time.Millisecond), d[0].Round(time.Millisecond), d[n-1].Round(time.Millisecond))
			}
		})
	}

	t.Run("fork of the last", func(t *testing.T) {
		last := cks[len(cks)-1]
		out := cklite(t, e.d, "fork", "-n", "1", "--prefix", "pages-fork", last.id)
		var name string
		for _, l := range strings.Split(out, "\n") {
			if sub := forkLineRE.FindStringSubmatch(l); sub != nil {
				name = sub[1]
			}
		}
		if name == "" {
			t.Fatalf("cklite fork printed no running fork:\n%s", out)
		}
		id := forkIDsByName(t, e, []string{name})[0]
		memProc{rootfs: e.d.RootfsPath(id)}.expect(t, "the fork", last.state)
		mustCtr(t, e.d, "tasks", "delete", "-f", id)
		mustCtr(t, e.d, "containers", "delete", id)
	})

	t.Run("rm of a middle checkpoint", func(t *testing.T) {
		mid := cks[2]
		cklite(t, e.d, "checkpoint", "rm", "--image", mid.id)
		if _, err := os.Stat(mid.dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("image directory of the removed checkpoint: %v", err)
		}
		if dedup {
			if parent, err := filepath.EvalSymlinks(filepath.Join(cks[3].dir, criuimage.ParentLink)); err != nil || parent != cks[1].dir {
				t.Fatalf("checkpoint 4's parent after removing 3: %q (%v), want checkpoint 2's directory", parent, err)
			}
		}
		for _, i := range []int{3, 1, 4} {
			cklite(t, e.d, "rollback", c.ID(), cks[i].id)
			p.expect(t, fmt.Sprintf("rolled back to checkpoint %d after removing 3", i+1), cks[i].state)
		}
	})

	t.Run("prune of an unlisted parent", func(t *testing.T) {
		// rm without --image leaves checkpoint 2's directory, which checkpoint 4 reads from;
		// prune --orphaned removes it, detaching checkpoint 4 first.
		cklite(t, e.d, "checkpoint", "rm", cks[1].id)
		cklite(t, e.d, "checkpoint", "prune", "--orphaned")
		if _, err := os.Stat(cks[1].dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("prune --orphaned left checkpoint 2's directory: %v", err)
		}
		if dedup {
			if parent, err := filepath.EvalSymlinks(filepath.Join(cks[3].dir, criuimage.ParentLink)); err != nil || parent != cks[0].dir {
				t.Fatalf("checkpoint 4's parent after pruning 2: %q (%v), want checkpoint 1's directory", parent, err)
			}
		}
		for _, i := range []int{3, 4, 0} {
			cklite(t, e.d, "rollback", c.ID(), cks[i].id)
			p.expect(t, fmt.Sprintf("rolled back to checkpoint %d after pruning 2", i+1), cks[i].state)
		}
	})

	t.Run("export of the last", func(t *testing.T) {
		last := cks[len(cks)-1]
		ref := "localhost/cklite/pages:" + last.id
		began := time.Now()
		cklite(t, e.d, "checkpoint", "export", "--ref", ref, last.id)
		logTiming(t, fmt.Sprintf("cklite checkpoint export, %d MiB", mib), began)
		exported, err := e.d.Client().GetImage(e.ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		unpack(t, e, exported)
		rc := e.newContainer(t, "pages-imported", exported)
		if _, err := e.restore(rc, nil); err != nil {
			t.Fatalf("restoring from the exported image: %v%s", err, criuErrors(err))
		}
		memProc{rootfs: e.d.RootfsPath(rc.ID())}.expect(t, "restored from the exported image", last.state)
	})
}

// pagesCheckpoint asks the process of container id for step, checkpoints it with `cklite checkpoint
// create` (into cklite's checkpoints directory) and checks it runs on with the same memory.
func (e *ckEnv) pagesCheckpoint(t *testing.T, id string, p memProc, step int, token string, mib int) pagesCheckpoint {
	t.Helper()
	st := p.stepTo(t, step)
	if st.token != token {
		t.Fatalf("step %d: token %s, the process started with %s", step, st.token, token)
	}
	began := time.Now()
	var v struct {
		ID        string `json:"id"`
		ImagePath string `json:"imagePath"`
	}
	if err := json.Unmarshal([]byte(cklite(t, e.d, "checkpoint", "create", "--format", "json", id)), &v); err != nil {
		t.Fatal(err)
	}
	logTiming(t, fmt.Sprintf("cklite checkpoint create, %d MiB held", mib), began)
	return pagesCheckpoint{id: v.ID, dir: v.ImagePath, state: st}
}

// memContainer creates and starts container id running memScript with mib MiB on the sandbox
// image, and returns the process and its first state.
func (e *ckEnv) memContainer(t *testing.T, id string, mib int) (client.Container, client.Task, memProc, memState) {
	t.Helper()
	img := e.sandboxImage(t)
	c := e.newContainer(t, id, img, oci.WithProcessArgs("python3", "-c", memScript), oci.WithEnv([]string{"MIB=" + strconv.Itoa(mib)}))
	task, err := startTask(e.ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	p := memProc{rootfs: e.d.RootfsPath(c.ID())}
	return c, task, p, parseState(t, p.wait(t, "the process's first state", "mem", func(f []string) bool { return len(f) == 3 }))
}

// TestPagesDedupKilled kills the shim (pkg/fault's pagechain-swap) in the middle of a checkpoint's
// deduplication, between a rewritten pages file put in place and the pagemap naming it: the
// checkpoint, linked to its parent but not rewritten, restores to its memory, its parent too, and
// `checkpoint rm --image` of the parent detaches it, sweeping what the kill left.
func TestPagesDedupKilled(t *testing.T) {
	e, c, p, ck1, ck2 := killedStoring(t, "pages-killed", fault.PagechainSwap)
	if _, err := os.Lstat(filepath.Join(ck2.dir, criuimage.ParentLink)); err != nil {
		t.Fatalf("the killed deduplication did not reach its swap: %v", err)
	}
	if _, err := pagechain.ReadReport(ck2.dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a report of the killed deduplication: %v", err)
	}
	restoreAfterKill(t, e, c, ck2.dir)
	p.expect(t, "restored from the killed deduplication's checkpoint", ck2.state)
	e.rollback(t, c, ck1.dir)
	p.expect(t, "restored from its parent", ck1.state)
	// The kill left the rewritten pages file, which no pagemap names yet.
	if pages, named := pagesFiles(t, ck2.dir); len(pages) != len(named)+1 {
		t.Fatalf("after the kill: pages files %v, named by pagemaps %v: want one left over", pages, named)
	}
	cklite(t, e.d, "checkpoint", "rm", "--image", ck1.id)
	pages, named := pagesFiles(t, ck2.dir)
	if _, err := os.Lstat(filepath.Join(ck2.dir, criuimage.ParentLink)); !errors.Is(err, os.ErrNotExist) || len(pages) != len(named) {
		t.Fatalf("after removing its parent: parent link %v, pages files %v, named %v", err, pages, named)
	}
	e.rollback(t, c, ck2.dir)
	p.expect(t, "restored from the detached checkpoint", ck2.state)
}

// pagesFiles lists dir's pages files and those its pagemaps name.
func pagesFiles(t *testing.T, dir string) ([]string, map[string]string) {
	t.Helper()
	named, err := criuimage.PagesFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob(filepath.Join(dir, "pages-*.img"))
	if err != nil {
		t.Fatal(err)
	}
	return pages, named
}

// waitReport waits for the shim's deduplication of dir to be done (or declined).
func waitReport(t *testing.T, dir string) pagechain.Report {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r, err := pagechain.ReadReport(dir)
		if err == nil {
			return r
		}
		if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			t.Fatalf("deduplication report of %s: %v", dir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkDisk checks that every checkpoint after the first takes a small part of a full dump (the
// first) on disk, and each has the one before as its parent; without deduplication, that each is
// a full dump.
func checkDisk(t *testing.T, cks []pagesCheckpoint, mib int, dedup bool) {
	t.Helper()
	var total int64
	for i, ck := range cks {
		size := du(t, ck.dir)
		total += size
		parent, err := filepath.EvalSymlinks(filepath.Join(ck.dir, criuimage.ParentLink))
		switch {
		case i == 0 || !dedup:
			if size < int64(mib)<<20 || err == nil {
				t.Fatalf("checkpoint %d: %s on disk, parent %q: want a full dump of %d MiB", i+1, mibs(size), parent, mib)
			}
		case size > int64(mib)<<20/8:
			t.Fatalf("checkpoint %d: %s on disk, want well under the %d MiB of a full dump", i+1, mibs(size), mib)
		case err != nil || parent != cks[i-1].dir:
			t.Fatalf("checkpoint %d: parent %q (%v), want checkpoint %d's directory", i+1, parent, err, i)
		}
	}
	t.Logf("%d checkpoints of %d MiB held: %s on disk (dedup %v)", len(cks), mib, mibs(total), dedup)
}

// du is the disk usage of the files in dir (blocks, as du counts them; links not followed).
func du(t *testing.T, dir string) int64 {
	t.Helper()
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		total += fi.Sys().(*syscall.Stat_t).Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

func mibs(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// parents counts dir's parent image directories.
func parents(t *testing.T, dir string) int {
	t.Helper()
	chain, err := criuimage.Chain(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	return len(chain)
}

// TestPagesCompressKilled kills the shim (pkg/fault's pagechain-compress) in the middle of a
// checkpoint's compression, with a compressed pages file in place and the plain one not removed
// yet: the checkpoint restores to its memory (a restore reads the plain file), its parent too,
// and `checkpoint rm --image` of the parent detaches it, sweeping the form left over.
func TestPagesCompressKilled(t *testing.T) {
	e, c, p, ck1, ck2 := killedStoring(t, "pages-zkilled", fault.PagechainCompress)
	both := func() []string {
		zst, err := filepath.Glob(filepath.Join(ck2.dir, "pages-*.img"+criuimage.CompressedSuffix))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, z := range zst {
			if _, err := os.Stat(strings.TrimSuffix(z, criuimage.CompressedSuffix)); err == nil {
				out = append(out, z)
			}
		}
		return out
	}
	if b := both(); len(b) != 1 {
		t.Fatalf("after the kill: pages files in both forms %v, want one", b)
	}
	restoreAfterKill(t, e, c, ck2.dir)
	p.expect(t, "restored from the killed compression's checkpoint", ck2.state)
	e.rollback(t, c, ck1.dir)
	p.expect(t, "restored from its parent", ck1.state)
	cklite(t, e.d, "checkpoint", "rm", "--image", ck1.id)
	if b := both(); len(b) != 0 {
		t.Fatalf("after removing its parent: pages files in both forms %v", b)
	}
	e.rollback(t, c, ck2.dir)
	p.expect(t, "restored from the detached checkpoint", ck2.state)
}

// killedStoring checkpoints a python process holding 16 MiB twice, the shim armed to die at point
// (pkg/fault) while it stores the second checkpoint's memory, and returns once containerd has the
// dead task deleted.
func killedStoring(t *testing.T, name, point string) (*faultEnv, client.Container, memProc, pagesCheckpoint, pagesCheckpoint) {
	t.Helper()
	e := newFaultEnv(t, ckTimeout)
	c, task, p, start := e.memContainer(t, name, 16)
	ck1 := e.pagesCheckpoint(t, c.ID(), p, 1, start.token, 16)
	waitReport(t, ck1.dir)
	exited, err := task.Wait(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.arm(t, point)
	ck2 := e.pagesCheckpoint(t, c.ID(), p, 2, start.token, 16)
	select {
	case <-exited:
	case <-time.After(2 * time.Minute):
		t.Fatal("the shim did not die at " + point + " within 2 minutes")
	}
	e.arm(t, "")
	e.deleteDeadTask(t, c)
	return e, c, p, ck1, ck2
}

// restoreAfterKill restores c from dir once containerd has dropped the killed task.
func restoreAfterKill(t *testing.T, e *faultEnv, c client.Container, dir string) {
	t.Helper()
	eventually(t, "containerd to drop the killed task", func() error {
		_, err := e.restore(c, nil, client.WithRestoreImagePath(dir))
		if err != nil && !errdefs.IsAlreadyExists(err) {
			t.Fatalf("restoring %s from %s after the kill: %v%s", c.ID(), dir, err, criuErrors(err))
		}
		return err
	})
}
