package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	client "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/criuimage"
	"github.com/cklite/cklite/pkg/exechelper"
)

// Tests of cklite's init (pkg/exechelper/init.go, shim/init.go), asked for with the annotation.

var withCkliteInit = oci.WithAnnotations(map[string]string{"cklite.io/init": "true"})

// TestInitReapsExecs: CKLITE_EXECS (300) sequential execs in a container whose entrypoint is
// busybox `sleep`, which never reaps, under cklite's init: no zombie is left in the container,
// exit codes are exact (0, 1, 255, 137), execs stay in the tree (a detached one is a child of
// the init) and a leave-running checkpoint keeps it running. Without the init the same execs
// leave up to 16 zombies (TestExecsMany).
func TestInitReapsExecs(t *testing.T) {
	n := envInt(t, "CKLITE_EXECS", 300, 1)
	e := newCkEnv(t)
	c := e.newContainer(t, "init-execs", e.img, oci.WithProcessArgs("sleep", "1000000"), withCkliteInit)
	task, err := startTask(e.ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	expectInit(t, e, c.ID(), task, "sleep 1000000")
	for range n {
		e.expectExecExit(t, task, 0, "true", 0)
	}
	for _, want := range []uint32{0, 1, 255} {
		e.expectExecExit(t, task, 0, fmt.Sprintf("exit %d", want), want)
	}
	e.expectExecExit(t, task, 0, "kill -9 $$", 137)
	expectNoZombies(t, e, task)
	t.Logf("%d execs under cklite's init and busybox sleep: no zombie", n+4)

	p := e.newExec(t, task, cio.NullIO, "sleep", "1000000")
	if err := p.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	if parent := parentOf(t, int(p.Pid())); parent != int(task.Pid()) {
		t.Fatalf("detached exec's parent is %d, want the init %d", parent, task.Pid())
	}
	cklite(t, e.d, "checkpoint", "create", c.ID())
	if st, err := p.Status(e.ctx); err != nil || st.Status != client.Running {
		t.Fatalf("detached exec after the checkpoint: %+v %v, want running", st, err)
	}
}

// TestInitFromCLIs: `nerdctl run --annotation cklite.io/init=true` and `ctr run --annotation
// cklite.io/init=true` run cklite's init; `nerdctl inspect` and containerd show the container's
// own command, `ctr tasks ps` lists the init and the entrypoint, execs through nerdctl and ctr
// report their exit codes (nerdctl's in its message) and leave no zombie.
func TestInitFromCLIs(t *testing.T) {
	e := newCkEnv(t)
	annotation := []string{"--annotation", "cklite.io/init=true"}
	for _, tc := range []struct {
		name string
		run  func() string // starts the container, returns its id
		exec func(id, script string) int
	}{
		{"nerdctl", func() string {
			return runDetached(t, e.d, harness.CkliteRuntime, "init-nerdctl", annotation, "sleep", "1000000")
		}, func(id, script string) int {
			// nerdctl exec exits 1 for any failure, saying "exec failed with exit code N".
			r := nerdctlResult(t, e.d, "", "exec", id, "sh", "-c", script)
			code := r.code
			if _, after, ok := strings.Cut(r.stderr, "exit code "); ok {
				_, _ = fmt.Sscan(after, &code)
			}
			return code
		}},
		{"ctr", func() string {
			mustCtr(t, e.d, append(append([]string{"run", "-d", "--fifo-dir", e.d.FIFODir(), "--runtime", harness.CkliteRuntime}, annotation...),
				busybox.Name, "init-ctr", "sleep", "1000000")...)
			return "init-ctr"
		}, func(id, script string) int {
			return ctrResult(t, e.d, "", "tasks", "exec", "--exec-id", "x-"+randomTag(), id, "sh", "-c", script).code
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := tc.run()
			task := e.taskOf(t, id)
			expectInit(t, e, id, task, "sleep 1000000")
			if tc.name == "nerdctl" {
				if got := strings.TrimSpace(nerdctl(t, e.d, "inspect", "-f", "{{.Path}} {{.Args}}", id)); got != "sleep [1000000]" {
					t.Fatalf("nerdctl inspect shows the command %q, want the container's own", got)
				}
			}
			ps := strings.Fields(ctr(t, e.d, "tasks", "ps", id))
			for _, pid := range taskPids(t, e, task) {
				if !slices.Contains(ps, fmt.Sprint(pid)) {
					t.Fatalf("ctr tasks ps %s printed %q, without process %d", id, ps, pid)
				}
			}
			for _, want := range []int{0, 1, 255, 137} {
				script := fmt.Sprintf("exit %d", want)
				if want == 137 {
					script = "kill -9 $$"
				}
				if got := tc.exec(id, script); got != want {
					t.Fatalf("%s exec %q exited %d, want %d", tc.name, script, got, want)
				}
			}
			expectNoZombies(t, e, task)
		})
	}
}

// TestInitTerminal: `nerdctl run -it` of a shell under cklite's init: the shell has the terminal
// (its tty, size and resize), its group is the foreground one, so ^C reaches the job it runs
// (130), not the init; a leave-running checkpoint keeps the session answering, and the shell's
// `exit 5` is nerdctl's exit code.
func TestInitTerminal(t *testing.T) {
	e := newCkEnv(t)
	s := startTerminal(t, e.d, 30, 100, "run", "-it", "--rm", "--name", "init-tty", "--runtime", harness.CkliteRuntime,
		"--snapshotter", ckliteSnapshotter, "--net", "none", "--annotation", "cklite.io/init=true", busybox.Name, "sh")
	checkTerminal(t, s)
	s.send(t, `sh -c 'echo "RE""ADY"; exec sleep 1000'`)
	s.expect(t, regexp.MustCompile(`READY`))
	s.send(t, "\x03")
	s.send(t, `echo "AF""TER=$?"`)
	if got := s.expect(t, regexp.MustCompile(`AFTER=(\d+)`))[1]; got != "130" {
		t.Fatalf("the job ^C reached exited %s, want 130; the terminal shows:\n%s", got, s.shows())
	}
	id := strings.TrimSpace(nerdctl(t, e.d, "inspect", "-f", "{{.ID}}", "init-tty"))
	expectInit(t, e, id, e.taskOf(t, id), "sh")
	cklite(t, e.d, "checkpoint", "create", id)
	s.send(t, `echo "AF""TER=checkpoint"`)
	s.expect(t, regexp.MustCompile(`AFTER=checkpoint`))
	s.send(t, "exit 5")
	if code := s.wait(t); code != 5 {
		t.Fatalf("nerdctl run -it exited %d after the shell's `exit 5`; the terminal shows:\n%s", code, s.shows())
	}
}

// TestInitSignals: the task's exit status is its entrypoint's under cklite's init, 128+N when
// signal N killed it, and `ctr tasks kill -s TERM` reaches the entrypoint (no longer PID 1, a
// `sleep` without a handler dies of it).
func TestInitSignals(t *testing.T) {
	e := newCkEnv(t)
	for _, tc := range []struct {
		name   string
		script string // the entrypoint; it touches /tmp/ready once its traps are set
		kill   bool   // ctr tasks kill -s TERM once ready
		want   uint32
	}{
		{"exit", "touch /tmp/ready; exit 3", false, 3},
		{"killed", "touch /tmp/ready; kill -9 $$", false, 137},
		{"trap", `trap "exit 42" TERM; touch /tmp/ready; while :; do sleep 1 & wait; done`, true, 42},
		{"default", "touch /tmp/ready; exec sleep 1000000", true, 143},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "init-signal-" + tc.name
			c := e.newContainer(t, id, e.img, oci.WithProcessArgs("sh", "-c", tc.script), withCkliteInit)
			task, err := startTask(e.ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			exited, err := task.Wait(e.ctx) // a task that exited already answers at once
			if err != nil {
				t.Fatal(err)
			}
			if tc.kill {
				eventually(t, "the entrypoint's traps", func() error {
					_, err := os.Stat(filepath.Join(e.d.RootfsPath(id), "tmp", "ready"))
					return err
				})
				ctr(t, e.d, "tasks", "kill", "-s", "TERM", id)
			}
			if st := <-exited; st.ExitCode() != tc.want {
				t.Fatalf("task of %q exited %d, want %d", tc.script, st.ExitCode(), tc.want)
			}
		})
	}
}

// maxInitDump bounds the init's memory in a dump: it is in every checkpoint (measured: under 1 MiB).
const maxInitDump = 4 << 20

// TestInitCheckpointRollback: cklite's init, its entrypoint and an exec'd process, each serving
// probes with a token drawn at start, are kept by a leave-running checkpoint and come back with
// their tokens after a rollback in place, in a fork, in a container created from the checkpoint
// exported as an image and in a new task restored from its image directory; after the rollback the init is PID 1 again, execs report
// exact exit codes and leave no zombie, and `ctr tasks kill -s TERM` ends the restored task
// with its entrypoint's status.
func TestInitCheckpointRollback(t *testing.T) {
	e := newCkEnv(t)
	c := e.newContainer(t, "init-ck", e.img, oci.WithProcessArgs("sh", "-c", probeScript("entry")), withCkliteInit)
	task, err := startTask(e.ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	expectInit(t, e, c.ID(), task, "sh -c "+probeScript("entry"))
	srv := e.newExec(t, task, cio.NullIO, "sh", "-c", probeScript("srv"))
	if err := srv.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	srvExited, err := srv.Wait(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	rootfs := e.d.RootfsPath(c.ID())
	before := map[string]string{"entry": probe(t, rootfs, "entry"), "srv": probe(t, rootfs, "srv")}
	expectProbes := func(t *testing.T, rootfs, when string) {
		t.Helper()
		for name, want := range before {
			if got := probe(t, rootfs, name); got != want {
				t.Fatalf("%s %s: %q, want %q (same pid and token)", name, when, got, want)
			}
		}
	}

	dir := checkpointDir(t, e.d, "init-ck")
	m := createdID.FindStringSubmatch(cklite(t, e.d, "checkpoint", "create", "--image-path", dir, c.ID()))
	if m == nil {
		t.Fatal("cklite checkpoint create printed no checkpoint id")
	}
	expectProbes(t, rootfs, "after the leave-running checkpoint")
	// The init is PID 1 in the container, pagemap-1.img in the dump.
	pm, err := criuimage.ReadPagemap(filepath.Join(dir, criuimage.PagemapName(1)))
	if err != nil {
		t.Fatal(err)
	}
	dumped := pm.PresentPages() * uint64(os.Getpagesize())
	t.Logf("the init's memory in the dump: %d KiB", dumped>>10)
	if dumped > maxInitDump {
		t.Fatalf("the init's memory in the dump is %d KiB, want at most %d", dumped>>10, maxInitDump>>10)
	}
	expectInit(t, e, c.ID(), task, "sh -c "+probeScript("entry"))
	// The dump names the helper's build; a rollback onto another build (an upgrade since, here
	// the dump's record changed) is refused before anything is killed.
	meta, err := checkpoint.Read(dir)
	if err != nil || !meta.Init || meta.InitBuild == "" {
		t.Fatalf("checkpoint metadata %+v, %v: want init and the helper's build id", meta, err)
	}
	upgraded := meta
	upgraded.InitBuild = "other"
	if err := checkpoint.Write(dir, upgraded); err != nil {
		t.Fatal(err)
	}
	ckliteFails(t, e.d, "built as other", "rollback", c.ID(), m[1])
	expectProbes(t, rootfs, "after a rollback onto another build of the helper")
	if err := checkpoint.Write(dir, meta); err != nil {
		t.Fatal(err)
	}

	if err := srv.Kill(e.ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st := <-srvExited; st.ExitCode() != 137 {
		t.Fatalf("killed exec exited %d, want 137", st.ExitCode())
	}
	cklite(t, e.d, "rollback", c.ID(), m[1])
	expectProbes(t, rootfs, "after the rollback")
	task, err = c.Task(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	expectInit(t, e, c.ID(), task, "sh -c "+probeScript("entry"))
	for _, want := range []uint32{0, 1, 255} {
		e.expectExecExit(t, task, 0, fmt.Sprintf("exit %d", want), want)
	}
	e.expectExecExit(t, task, 0, "kill -9 $$", 137)
	for range 20 {
		e.expectExecExit(t, task, 0, "true", 0)
	}
	expectNoZombies(t, e, task)

	forked := cklite(t, e.d, "fork", "-n", "1", m[1])
	ids := forkedIDs(t, e, forked)
	if len(ids) != 1 {
		t.Fatalf("cklite fork -n 1 printed %q", forked)
	}
	expectProbes(t, e.d.RootfsPath(ids[0]), "in the fork")

	ref := registry.Addr + "/cklite/checkpoint:init-" + randomTag()
	cklite(t, e.d, "checkpoint", "export", "--ref", ref, m[1])
	img, err := e.d.Client().GetImage(e.ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	unpack(t, e, img)
	e.restoreFromImage(t, "init-imported", img)
	expectProbes(t, e.d.RootfsPath("init-imported"), "in the container made from the checkpoint image")

	exited, err := task.Wait(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	ctr(t, e.d, "tasks", "kill", "-s", "TERM", c.ID())
	if st := <-exited; st.ExitCode() != 128+uint32(syscall.SIGTERM) {
		t.Fatalf("restored task exited %d after SIGTERM, want %d (its entrypoint's status)", st.ExitCode(), 128+syscall.SIGTERM)
	}

	// A new task from the checkpoint's image directory (the Go client's restore, as ctr's and
	// nerdctl start --checkpoint's): the init comes back with the dump, and reaps.
	task = e.rollback(t, c, dir)
	expectProbes(t, rootfs, "in a new task restored from the image directory")
	expectInit(t, e, c.ID(), task, "sh -c "+probeScript("entry"))
	e.expectExecExit(t, task, 0, "exit 7", 7)
	expectNoZombies(t, e, task)
}

// expectInit checks that task's PID 1 is cklite's init running the entrypoint (cmd, its command
// line with spaces) as its child, that both are the task's processes, and that containerd still
// shows the container's own command.
func expectInit(t *testing.T, e *ckEnv, id string, task client.Task, cmd string) {
	t.Helper()
	init := int(task.Pid())
	// Start returns once libcontainer let its init stage go on to exec the process.
	eventually(t, "the task's process to run the init", func() error {
		if got, want := cmdline(init), exechelper.InitPath+" -- "+cmd; got != want {
			return fmt.Errorf("it runs %q, want %q", got, want)
		}
		return nil
	})
	c, err := e.d.Client().LoadContainer(e.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := c.Spec(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(spec.Process.Args, " "); got != cmd {
		t.Fatalf("containerd shows the command %q, want %q", got, cmd)
	}
	eventually(t, "the init's entrypoint", func() error {
		pids := taskPids(t, e, task)
		if !slices.Contains(pids, uint32(init)) {
			return fmt.Errorf("the task's processes %v leave out its init %d", pids, init)
		}
		// Short-lived processes (the workload's sleeps) come and go: one read is of one process.
		for _, pid := range pids {
			if int(pid) != init && cmdline(int(pid)) == cmd && parentOf(t, int(pid)) == init {
				return nil
			}
		}
		return fmt.Errorf("no process among the task's %v runs %q as a child of the init %d", pids, cmd, init)
	})
}

// expectNoZombies waits until no process of task's has a zombie child: the init reaps each
// orphan once the kernel tells it of the exit (SIGCHLD), after the exec's exit may be published.
func expectNoZombies(t *testing.T, e *ckEnv, task client.Task) {
	t.Helper()
	eventually(t, "no zombie in the container", func() error {
		pids := taskPids(t, e, task)
		if z := zombiesOf(pids); len(z) > 0 {
			return fmt.Errorf("zombies %v", z)
		}
		return nil
	})
}

// zombiesOf lists the zombies whose parent is among parents: the zombies of a container, whose
// processes are parents.
func zombiesOf(parents []uint32) []int {
	entries, _ := os.ReadDir("/proc")
	var zombies []int
	for _, ent := range entries {
		var pid int
		if _, err := fmt.Sscan(ent.Name(), &pid); err != nil {
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil || !strings.Contains(string(status), "\nState:\tZ") {
			continue
		}
		var ppid uint32
		for _, l := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(l, "PPid:\t"); ok {
				_, _ = fmt.Sscan(v, &ppid)
			}
		}
		if slices.Contains(parents, ppid) {
			zombies = append(zombies, pid)
		}
	}
	return zombies
}

// cmdline is process pid's command line, its arguments joined with spaces; "" once it is gone.
func cmdline(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return strings.Join(strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00"), " ")
}

// TestInitCRI: a pod annotated cklite.io/init=true (the CRI passes cklite.io/* pod annotations
// to cklite, pod_annotations): its container runs under cklite's init, ExecSync's codes are exact
// (0, 1, 255, 137), 100 ExecSyncs under busybox `sleep` leave no zombie, and the pod's sandbox
// runs its pause process (the test's pause image: a shell) as PID 1, without the init.
func TestInitCRI(t *testing.T) {
	d, cri := startCRI(t)
	ctx := criContext(t)
	pod, id := runAnnotatedSleeper(t, cri, "init", map[string]string{"cklite.io/init": "true"})
	for _, want := range []int32{0, 1, 255} {
		expectExecSync(t, cri, id, fmt.Sprintf("exit %d", want), 10, want)
	}
	expectExecSync(t, cri, id, "kill -9 $$", 10, 137)
	for range 100 {
		expectExecSync(t, cri, id, "true", 10, 0)
	}

	nsCtx := namespaces.WithNamespace(ctx, harness.CRINamespace)
	taskOf := func(id string) client.Task {
		c, err := d.Client().LoadContainer(nsCtx, id)
		if err != nil {
			t.Fatal(err)
		}
		task, err := c.Task(nsCtx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return task
	}
	task := taskOf(id)
	if got, want := cmdline(int(task.Pid())), exechelper.InitPath+" -- sleep 1000000"; got != want {
		t.Fatalf("the container's process runs %q, want %q", got, want)
	}
	eventually(t, "no zombie in the container", func() error {
		ps, err := task.Pids(nsCtx)
		if err != nil {
			return err
		}
		var pids []uint32
		for _, p := range ps {
			pids = append(pids, p.Pid)
		}
		if z := zombiesOf(pids); len(z) > 0 {
			return fmt.Errorf("zombies %v", z)
		}
		return nil
	})
	if got := cmdline(int(taskOf(pod.ID).Pid())); got == "" || strings.HasPrefix(got, exechelper.InitPath) {
		t.Fatalf("the pod's sandbox runs %q, want its pause process without the init", got)
	}
}
