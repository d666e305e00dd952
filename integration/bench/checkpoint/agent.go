package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cklite/cklite/integration/workload"
)

// An agent is what the agent-sandbox and tree-search workloads run: a process that holds state in
// memory and edits a project directory of a few thousand files. Both kinds speak the protocol of
// workload.CounterScript (TOKEN N STATE in /tmp/count; it only advances while /tmp/run exists),
// so workload.Counter drives and checks them; on every count the agent also overwrites one of
// the files in /work/project/edits with its token and count, so memory and files move together.
type agentKind string

const (
	// busyboxAgent is a shell in the benchmark's busybox image, next to the probe: cheap enough
	// for the quick mode's tree search.
	busyboxAgent agentKind = "busybox"
	// pythonAgent is python3 in the debootstrap sandbox image, holding -mem MB in a bytearray and
	// a dict of 100000 entries: the realistic agent sandbox.
	pythonAgent agentKind = "python"
)

const (
	projectDir = "work/project"
	// editFiles is how many files of the project the agent itself rewrites, round robin.
	editFiles = 100
	// fileBytes is the size of each of the project's files written by the host.
	fileBytes = 2048
	// filesPerDir keeps directories the size of a source tree's.
	filesPerDir = 100
)

// agentSpec is what a sandbox runs: an agent of kind holding memMB. A slow one wakes less often
// (the shell every 100 ms instead of 20, the probe every 20 ms instead of 1), for the fan-out and
// the forks' checkpoints: 100 forks of a fast one make 100 000 wakeups and 10 000 process spawns
// a second and saturate 2 cores (load average 200 here), so that the later forks would measure
// the earlier ones' load. churnKB (python only) is how much of the held memory the agent rewrites
// on every count, with fresh random bytes read straight into it (no temporary object, whose
// pages would change too): the heap an agent's step changes.
type agentSpec struct {
	kind    agentKind
	memMB   int
	slow    bool
	churnKB int
}

// shAgent is CounterScript with the edit added in the counting branch, looping every period.
func shAgent(period string) string {
	s := strings.Replace(workload.CounterScript,
		"i=$((i+1)); s=run;",
		fmt.Sprintf("i=$((i+1)); s=run; echo \"$t $i\" > /%s/edits/e$((i %% %d));", projectDir, editFiles), 1)
	return strings.Replace(s, "sleep 0.02", "sleep "+period, 1)
}

// pyAgent is the same loop in python; its arguments are the memory to hold in MB, the project
// directory, the files it edits, the probe's tick and least gap logged (seconds) and the KiB of
// held memory rewritten on every count. A thread speaks the probe's protocol (probe/main.go:
// "TOKEN TICKS 0" in /tmp/probe, written every 20 ms; gaps over the least one between ticks
// appended to /tmp/gaps), so the agent's downtime is measured as the busybox one's is.
const pyAgent = `import os, threading, time, uuid
TICK, MIN_GAP, CHURN = %[4]s, %[5]s, %[6]d << 10
def probe():
    tok, ticks, last = uuid.uuid4().hex[:16], 0, time.monotonic()
    every = max(1, int(0.02 / TICK))
    while True:
        time.sleep(TICK)
        now = time.monotonic()
        if now - last > MIN_GAP:
            with open("/tmp/gaps", "a") as f:
                f.write("%%d %%d\n" %% (time.time_ns(), int((now - last) * 1e9)))
        last, ticks = now, ticks + 1
        if ticks %% every == 0:
            with open("/tmp/probe.new", "w") as f:
                f.write("%%s %%d 0\n" %% (tok, ticks))
            os.replace("/tmp/probe.new", "/tmp/probe")
threading.Thread(target=probe, daemon=True).start()
held = bytearray(os.urandom(%[1]d << 20))
rnd = open("/dev/urandom", "rb", buffering=0) if CHURN else None
state = {k: str(k) for k in range(100000)}
t, i = str(uuid.uuid4()), 0
os.makedirs("/%[2]s/edits", exist_ok=True)
while True:
    if os.path.exists("/tmp/run"):
        i += 1
        s = "run"
        state[i %% 100000] = t + str(i)
        if CHURN and CHURN <= len(held):
            at = (i * CHURN) %% (len(held) - CHURN + 1)
            rnd.readinto(memoryview(held)[at:at + CHURN])
        with open("/%[2]s/edits/e%%d" %% (i %% %[3]d), "w") as f:
            f.write("%%s %%d\n" %% (t, i))
    else:
        s = "idle"
    with open("/tmp/count.new", "w") as f:
        f.write("%%s %%d %%s\n" %% (t, i, s))
    os.replace("/tmp/count.new", "/tmp/count")
    time.sleep(0.02)
`

// args is the agent's command line; the busybox one runs the probe next to it, which holds the
// memory instead.
func (a agentSpec) args() []string {
	if a.kind == pythonAgent {
		tick, minGap := "0.001", "0.010"
		if a.slow {
			tick, minGap = "0.02", "0.1"
		}
		return []string{"python3", "-c", fmt.Sprintf(pyAgent, a.memMB, projectDir, editFiles, tick, minGap, a.churnKB)}
	}
	period, probe := "0.02", ""
	if a.slow {
		period, probe = "0.1", "-tick 20ms -min-gap 100ms "
	}
	return []string{"sh", "-c", fmt.Sprintf("mkdir -p /%s/edits; probe %s-mem %d & %s", projectDir, probe, a.memMB, shAgent(period))}
}

// writeProject writes n files of fileBytes into the project directory, as a host-side `git
// checkout` would: content seeded by the file's number, so that every sandbox gets the same.
func writeProject(rootfs string, n int) error {
	for i := range n {
		dir := filepath.Join(rootfs, projectDir, fmt.Sprintf("src%02d", i/filesPerDir))
		if i%filesPerDir == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
		}
		if err := writeFile(filepath.Join(dir, fmt.Sprintf("f%03d.txt", i%filesPerDir)), stream(3000, i), fileBytes); err != nil {
			return err
		}
	}
	return nil
}

// editProject is the host's share of a tree-search step, a tool call that touches files: it
// rewrites k files of the project chosen by seed and adds a new one.
func editProject(rootfs string, n, k int, seed int) error {
	for j := range k {
		i := (seed*7919 + j*104729) % n
		name := filepath.Join(rootfs, projectDir, fmt.Sprintf("src%02d", i/filesPerDir), fmt.Sprintf("f%03d.txt", i%filesPerDir))
		if err := writeFile(name, stream(4000+seed, j), fileBytes); err != nil {
			return err
		}
	}
	return writeFile(filepath.Join(rootfs, projectDir, fmt.Sprintf("new-%04d.txt", seed)), stream(5000, seed), fileBytes)
}

// hashProject hashes the project directory: every path, mode and content, in walk order.
func hashProject(rootfs string) (string, error) {
	root := filepath.Join(rootfs, projectDir)
	h := sha256.New()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		fmt.Fprintf(h, "%s %v\n", rel, d.Type())
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(h, f)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("hashing the project: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
