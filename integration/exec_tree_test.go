package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	client "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cklite/cklite/integration/workload"
)

// TestExecDetachedSurvivesCheckpoint: processes started with exec without a terminal (the Go
// client's task.Exec, `nerdctl exec -d`) are part of the checkpoint. A leave-running checkpoint
// keeps them running with the same pid and memory (a token drawn at start) and their output
// reaching the client; after a rollback in place and in each of two forks the ones that ran at
// the checkpoint are back with their state at the checkpoint, writing to their stdout still.
func TestExecDetachedSurvivesCheckpoint(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "exectree")
	// "out" answers probes and echoes each nonce to its stdout; "quiet" has no stdio.
	var out lockedBuffer
	outScript := strings.Replace(probeScript("out"), `rm -f /tmp/probe-out.req`, `rm -f /tmp/probe-out.req; echo "seen $n"`, 1)
	pOut := e.newExec(t, task, cio.NewCreator(cio.WithStreams(nil, &out, &out)), "sh", "-c", outScript)
	pQuiet := e.newExec(t, task, cio.NullIO, "sh", "-c", probeScript("quiet"))
	for _, p := range []client.Process{pOut, pQuiet} {
		if err := p.Start(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	outExited, err := pOut.Wait(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	nerdctl(t, e.d, "exec", "-d", c.ID(), "sh", "-c", probeScript("nerd"))
	before := map[string]string{}
	for _, name := range []string{"out", "quiet", "nerd"} {
		before[name] = probe(t, cnt.Rootfs, name)
	}
	hostPid := pOut.Pid()

	dir := checkpointDir(t, e.d, "exectree")
	created := cklite(t, e.d, "checkpoint", "create", "--image-path", dir, c.ID())
	m := createdID.FindStringSubmatch(created)
	if m == nil {
		t.Fatalf("cklite checkpoint create printed %q", created)
	}
	for name, want := range before {
		if got := probe(t, cnt.Rootfs, name); got != want {
			t.Fatalf("exec'd %s after the leave-running checkpoint: %q, want %q (same pid and token)", name, got, want)
		}
	}
	for _, p := range []client.Process{pOut, pQuiet} {
		if st, err := p.Status(e.ctx); err != nil || st.Status != client.Running {
			t.Fatalf("exec %s after the checkpoint: %+v %v, want running", p.ID(), st, err)
		}
	}
	nonce := probeNonce(t, cnt.Rootfs, "out")
	eventually(t, "the exec's output after the checkpoint", func() error {
		if !strings.Contains(out.String(), "seen "+nonce) {
			return fmt.Errorf("output so far: %q", out.String())
		}
		return nil
	})
	t.Logf("exec %s: host pid %d before the checkpoint, %d after", pOut.ID(), hostPid, e.execPid(t, task, pOut.ID()))

	// A memory-only checkpoint is CRIU's dump leaving the processes running: not even the host
	// pid changes.
	pidNow := e.execPid(t, task, pOut.ID())
	cklite(t, e.d, "checkpoint", "create", "--memory-only", c.ID())
	for name, want := range before {
		if got := probe(t, cnt.Rootfs, name); got != want {
			t.Fatalf("exec'd %s after the memory-only checkpoint: %q, want %q", name, got, want)
		}
	}
	if after := e.execPid(t, task, pOut.ID()); after != pidNow {
		t.Fatalf("exec %s: host pid %d before the memory-only checkpoint, %d after", pOut.ID(), pidNow, after)
	}

	// Mutate: the exec'd "out" is killed (its exit is exact), the files change.
	if err := pOut.Kill(e.ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st := <-outExited; st.ExitCode() != 137 {
		t.Fatalf("killed exec exited %d, want 137", st.ExitCode())
	}
	if err := os.WriteFile(filepath.Join(cnt.Rootfs, "after"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	cklite(t, e.d, "rollback", c.ID(), m[1])
	for name, want := range before {
		if got := probe(t, cnt.Rootfs, name); got != want {
			t.Fatalf("exec'd %s after the rollback: %q, want %q", name, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(cnt.Rootfs, "after")); !os.IsNotExist(err) {
		t.Fatalf("a file written after the checkpoint survived the rollback: %v", err)
	}

	forked := cklite(t, e.d, "fork", "-n", "2", m[1][:8])
	ids := forkedIDs(t, e, forked)
	if len(ids) != 2 {
		t.Fatalf("cklite fork -n 2 printed %q", forked)
	}
	for _, id := range ids {
		for name, want := range before {
			if got := probe(t, e.d.RootfsPath(id), name); got != want {
				t.Fatalf("exec'd %s in fork %s: %q, want %q", name, id, got, want)
			}
		}
	}
}

// probeNonce asks workload name for a probe and returns the nonce it answered.
func probeNonce(t *testing.T, rootfs, name string) string {
	t.Helper()
	probe(t, rootfs, name)
	data, err := os.ReadFile(filepath.Join(rootfs, "tmp", "probe-"+name+".out"))
	if err != nil {
		t.Fatal(err)
	}
	nonce, _, _ := strings.Cut(string(data), " ")
	return nonce
}

// execPid is the pid the task lists for exec id.
func (e *ckEnv) execPid(t *testing.T, task client.Task, id string) int {
	t.Helper()
	procs, err := task.Pids(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.Info != nil && strings.Contains(string(p.Info.GetValue()), id) {
			return int(p.Pid)
		}
	}
	return 0
}

// TestExecTreeExitCodes: execs in the process tree report their exit codes exactly, under a PID
// 1 that reaps them (a shell: the status comes from the pidfd) and one that never does (sleep:
// from the zombie's /proc/PID/stat), run as the exec's user; a missing program fails Start
// naming it; and a checkpoint of a tree holding those zombies is taken.
func TestExecTreeExitCodes(t *testing.T) {
	e := newCkEnv(t)
	for _, init := range []struct {
		name string
		args []string
	}{
		{"reaping", []string{"sh", "-c", workload.CounterScript}},
		{"non-reaping", []string{"sleep", "1000000"}},
	} {
		t.Run(init.name, func(t *testing.T) {
			c := e.newContainer(t, "codes-"+init.name, e.img, oci.WithProcessArgs(init.args...))
			task, err := startTask(e.ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				script string
				uid    uint32
				want   uint32
			}{
				{"exit 0", 0, 0}, {"exit 1", 0, 1}, {"exit 255", 0, 255}, {"kill -9 $$", 0, 137},
				{`[ "$(id -u)" = 1000 ]`, 1000, 0},
			} {
				e.expectExecExit(t, task, tc.uid, tc.script, tc.want)
			}
			p := e.newExec(t, task, cio.NullIO, "no-such-program")
			if err := p.Start(e.ctx); err == nil || !strings.Contains(err.Error(), "no-such-program") {
				t.Fatalf("exec of a missing program started: %v", err)
			}
			if _, err := p.Delete(e.ctx); err != nil {
				t.Fatal(err)
			}
			cklite(t, e.d, "checkpoint", "create", c.ID())
			e.expectExecExit(t, task, 0, "exit 3", 3)
		})
	}
}

// expectExecExit runs script as uid in task and expects it to exit with want.
func (e *ckEnv) expectExecExit(t *testing.T, task client.Task, uid uint32, script string, want uint32) {
	t.Helper()
	spec, err := task.Spec(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	pspec := *spec.Process
	pspec.Args, pspec.Terminal, pspec.User.UID = []string{"sh", "-c", script}, false, uid
	p, err := task.Exec(e.ctx, "exec-"+randomTag(), &pspec, cio.NullIO)
	if err != nil {
		t.Fatal(err)
	}
	exited, err := p.Wait(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	if st := <-exited; st.ExitCode() != want {
		t.Fatalf("exec %q as uid %d exited %d, want %d", script, uid, st.ExitCode(), want)
	}
	if _, err := p.Delete(e.ctx); err != nil {
		t.Fatal(err)
	}
}
