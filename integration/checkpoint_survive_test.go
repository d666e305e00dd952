package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cklite/cklite/integration/harness"
	"github.com/cklite/cklite/integration/workload"
)

// survivor is the container of one case of TestCheckpointSurvives, as its hooks see it.
type survivor struct {
	e      *ckEnv
	task   client.Task
	rootfs string
	term   *terminal // the task's terminal, for cases that run on one
}

// TestCheckpointSurvives checkpoints containers holding what a sandbox commonly holds, leaving
// them running, and rolls each back to its checkpoint. Each case reads the state it holds (from
// the processes' memory and kernel objects: a token drawn at start, pids, a connection answering)
// before the checkpoint, after it, and after the rollback: all three must be equal.
func TestCheckpointSurvives(t *testing.T) {
	cases := []struct {
		name   string
		python bool // runs on the sandbox image (python3) instead of busybox
		spec   []oci.SpecOpts
		tty    bool
		// opts is what the case needs of CRIU besides the image path, as a client would ask.
		opts *options.CheckpointOptions
		// setup runs once the task has started: it starts what the case holds and waits until it
		// is there.
		setup func(t *testing.T, s *survivor)
		// state reads what the case holds; want is what it must look like before the checkpoint,
		// so that a case holding nothing fails instead of comparing nothing with nothing.
		state func(t *testing.T, s *survivor) string
		want  *regexp.Regexp
		// mutate, if set, changes the held state after the checkpoint: the rollback must undo it.
		mutate func(t *testing.T, s *survivor)
	}{
		{
			name: "process tree",
			// Two children of init and a grandchild, beside the counter in init's own memory.
			spec:  []oci.SpecOpts{oci.WithProcessArgs("sh", "-c", "sleep 1000 & sleep 1001 & (sleep 1002; :) & "+workload.CounterScript)},
			setup: func(t *testing.T, s *survivor) { newCounter(s.rootfs).advance(t, 2) },
			state: processTree,
			want:  regexp.MustCompile(`^sleep 1000 pid=\d+ ppid=1; sleep 1001 pid=\d+ ppid=1; sleep 1002 pid=\d+ ppid=\d+ grandparent=1; counter=\S+ \d+$`),
		},
		{
			name: "terminal",
			spec: []oci.SpecOpts{oci.WithProcessArgs("sh"), oci.WithTTY},
			tty:  true,
			setup: func(t *testing.T, s *survivor) {
				s.term.send(t, "X="+randomTag())
			},
			// The marker is split in the command so that the terminal's echo of it does not match.
			state: func(t *testing.T, s *survivor) string {
				s.term.send(t, `echo "V""AL=$X PID=$$ TTY=$(tty)"`)
				return s.term.expect(t, shellStateRE)[0]
			},
			want: regexp.MustCompile(`^VAL=[0-9a-f]{8} PID=1 TTY=/dev/pts/\d+$`),
		},
		{
			name:   "unix socket",
			python: true,
			spec:   []oci.SpecOpts{oci.WithProcessArgs("python3", "-c", holderScript, "unix")},
			state:  func(t *testing.T, s *survivor) string { return probe(t, s.rootfs, "holder") },
			want:   regexp.MustCompile(`^pid=\d+ token=[0-9a-f]{32} ping-pong new-connection$`),
		},
		{
			name:   "file lock",
			python: true,
			spec:   []oci.SpecOpts{oci.WithProcessArgs("python3", "-c", holderScript, "flock")},
			opts:   &options.CheckpointOptions{FileLocks: true},
			state:  func(t *testing.T, s *survivor) string { return probe(t, s.rootfs, "holder") },
			want:   regexp.MustCompile(`^pid=\d+ token=[0-9a-f]{32} lock held$`),
		},
		{
			name:   "deleted open file",
			python: true,
			spec:   []oci.SpecOpts{oci.WithProcessArgs("python3", "-c", holderScript, "ghost")},
			state:  func(t *testing.T, s *survivor) string { return probe(t, s.rootfs, "holder") },
			want:   regexp.MustCompile(`^pid=\d+ token=([0-9a-f]{32}) ghost-([0-9a-f]{32}) nlink=0$`),
		},
		{
			name: "tmpfs contents",
			spec: []oci.SpecOpts{counterSpec, oci.WithMounts([]specs.Mount{{
				Destination: "/scratch", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "size=16m"},
			}})},
			setup: func(t *testing.T, s *survivor) {
				s.e.exec(t, s.task, "sh", "-c", "echo kept > /scratch/kept && mkdir /scratch/dir && echo f > /scratch/dir/f")
			},
			// The tmpfs lives in the container's mount namespace only: read it from inside.
			state: func(t *testing.T, s *survivor) string {
				return s.e.exec(t, s.task, "sh", "-c", `awk '$2 == "/scratch" {print $3}' /proc/mounts; find /scratch | sort; cat /scratch/kept`)
			},
			want: regexp.MustCompile(`^tmpfs\n/scratch\n/scratch/dir\n/scratch/dir/f\n/scratch/kept\nkept\n$`),
			mutate: func(t *testing.T, s *survivor) {
				s.e.exec(t, s.task, "sh", "-c", "rm -r /scratch/dir && echo changed > /scratch/kept && echo new > /scratch/new")
			},
		},
		{
			name:   "established TCP connection",
			python: true,
			spec:   []oci.SpecOpts{oci.WithProcessArgs("python3", "-c", holderScript, "tcp")},
			opts:   &options.CheckpointOptions{OpenTcp: true},
			state:  func(t *testing.T, s *survivor) string { return probe(t, s.rootfs, "holder") },
			want:   regexp.MustCompile(`^pid=\d+ token=[0-9a-f]{32} ping-pong$`),
		},
	}

	e := newCkEnv(t)
	var sandbox client.Image
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			img := e.img
			if tc.python {
				if sandbox == nil {
					sandbox = e.sandboxImage(t)
				}
				img = sandbox
			}
			id := fmt.Sprintf("survivor-%d", i)
			c := e.newContainer(t, id, img, tc.spec...)
			s := &survivor{e: e, rootfs: e.d.RootfsPath(id)}
			var err error
			if s.task, err = e.restore(c, s.newIO(t, tc.tty)); err != nil {
				t.Fatalf("starting %s: %v", id, err)
			}
			if tc.setup != nil {
				tc.setup(t, s)
			}
			// Each state read is logged, before and after: a read that fails says when it failed.
			read := func(when string) string {
				t.Helper()
				t.Logf("reading what the container holds %s", when)
				got := tc.state(t, s)
				t.Logf("%s it holds %q", when, got)
				return got
			}
			before := read("before the checkpoint")
			if !tc.want.MatchString(before) {
				t.Fatalf("before the checkpoint the container holds %q, want a match of %q: it does not hold what the test checkpoints", before, tc.want)
			}

			dir := checkpointDir(t, e.d, id)
			e.checkpointTo(t, s.task, dir, tc.opts)
			if got := read("after the checkpoint"); got != before {
				t.Fatalf("after a checkpoint that leaves it running the container holds %q, want %q as before", got, before)
			}
			if tc.mutate != nil {
				tc.mutate(t, s)
			}

			e.deleteTask(t, c)
			if s.task, err = e.restore(c, s.newIO(t, tc.tty), client.WithRestoreImagePath(dir)); err != nil {
				t.Fatalf("restoring %s from %s: %v", id, dir, err)
			}
			if got := read("restored"); got != before {
				t.Fatalf("restored from the checkpoint the container holds %q, want %q, what it held at the checkpoint", got, before)
			}
		})
	}
}

// shellStateRE is what the terminal case's shell prints of its state.
var shellStateRE = regexp.MustCompile(`VAL=\S* PID=\d+ TTY=\S+`)

// newIO returns the IO of a new task of s: none, or a new terminal that becomes s.term.
func (s *survivor) newIO(t *testing.T, tty bool) cio.Creator {
	t.Helper()
	if !tty {
		return cio.NullIO
	}
	var creator cio.Creator
	s.term, creator = newClientTerminal(t, s.e)
	return creator
}

// newClientTerminal is a terminal (the type nerdctl sessions use in shim_tty_test.go) for a
// task the Go client runs on a pty: send writes to the task's stdin, expect reads what the pty
// shows.
func newClientTerminal(t *testing.T, e *ckEnv) (*terminal, cio.Creator) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Close()
		r.Close()
	})
	// done stays open: there is no nerdctl process whose exit would end the output.
	s := &terminal{master: w, done: make(chan struct{})}
	return s, cio.NewCreator(cio.WithStreams(r, terminalOutput{s}, nil), cio.WithTerminal, cio.WithFIFODir(e.d.FIFODir()))
}

// terminalOutput appends a task's output to a terminal's.
type terminalOutput struct{ *terminal }

func (o terminalOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.out.Write(p)
}

// processTree describes the process tree case's sleeps (pid, parent, the grandchild's
// grandparent) and the counter's token and value, from ps in the container.
func processTree(t *testing.T, s *survivor) string {
	t.Helper()
	type proc struct {
		ppid int
		args string
	}
	procs := map[int]proc{}
	for _, line := range strings.Split(strings.TrimSpace(s.e.exec(t, s.task, "ps", "-o", "pid,ppid,args")), "\n")[1:] {
		f := strings.Fields(line)
		pid, err1 := strconv.Atoi(f[0])
		ppid, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			t.Fatalf("ps printed %q", line)
		}
		procs[pid] = proc{ppid, strings.Join(f[2:], " ")}
	}
	var sleeps []string
	for pid, p := range procs {
		if !strings.HasPrefix(p.args, "sleep 100") {
			continue
		}
		desc := fmt.Sprintf("%s pid=%d ppid=%d", p.args, pid, p.ppid)
		if p.args == "sleep 1002" {
			desc += fmt.Sprintf(" grandparent=%d", procs[p.ppid].ppid)
		}
		sleeps = append(sleeps, desc)
	}
	slices.Sort(sleeps)
	x, err := newCounter(s.rootfs).Read()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s; counter=%s %d", strings.Join(sleeps, "; "), x.Token, x.N)
}

// exec runs args in task to completion and returns their output, failing the test unless they
// exit 0.
func (e *ckEnv) exec(t *testing.T, task client.Task, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	p := e.newExec(t, task, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr), cio.WithFIFODir(e.d.FIFODir())), args...)
	exited, err := p.Wait(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(e.ctx); err != nil {
		t.Fatalf("exec %q in %s: %v", args, task.ID(), err)
	}
	status := <-exited
	if _, err := p.Delete(e.ctx); err != nil {
		t.Fatal(err)
	}
	if status.ExitCode() != 0 {
		t.Fatalf("exec %q in %s exited %d: %s", args, task.ID(), status.ExitCode(), stderr.String())
	}
	return stdout.String()
}

// newExec creates an exec process of args in task with the init's spec, without a terminal.
func (e *ckEnv) newExec(t *testing.T, task client.Task, io cio.Creator, args ...string) client.Process {
	t.Helper()
	spec, err := task.Spec(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	pspec := *spec.Process
	pspec.Args, pspec.Terminal = args, false
	p, err := task.Exec(e.ctx, "exec-"+randomTag(), &pspec, io)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", args, task.ID(), err)
	}
	return p
}

// probeScript is a shell that serves probes as probe-NAME (see probe) with its pid and a token
// drawn at start, which only its memory holds.
func probeScript(name string) string {
	return strings.ReplaceAll(`t=$(cat /proc/sys/kernel/random/uuid)
while :; do
  if [ -e /tmp/probe-NAME.req ]; then
    n=$(cat /tmp/probe-NAME.req); rm -f /tmp/probe-NAME.req
    echo "$n pid=$$ token=$t" > /tmp/probe-NAME.new && mv /tmp/probe-NAME.new /tmp/probe-NAME.out
  fi
  sleep 0.02
done`, "NAME", name)
}

// probe asks a workload serving probes as name for its state: it writes a fresh nonce to
// /tmp/probe-NAME.req and returns what the workload answers after that nonce in
// /tmp/probe-NAME.out. A fresh nonce each time keeps an answer from before a rollback, which the
// rolled back filesystem holds, from passing for a new one.
func probe(t *testing.T, rootfs, name string) string {
	t.Helper()
	nonce := randomTag()
	req := filepath.Join(rootfs, "tmp", "probe-"+name+".req")
	// Renamed into place: the workload never reads half a nonce.
	if err := os.WriteFile(req+".tmp", []byte(nonce), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(req+".tmp", req); err != nil {
		t.Fatal(err)
	}
	var answer string
	eventually(t, "an answer to probe "+name, func() error {
		data, err := os.ReadFile(filepath.Join(rootfs, "tmp", "probe-"+name+".out"))
		if err != nil {
			return err
		}
		var ok bool
		if answer, ok = strings.CutPrefix(strings.TrimSpace(string(data)), nonce+" "); !ok {
			return fmt.Errorf("the last answer is %q, not to nonce %s", data, nonce)
		}
		return nil
	})
	return answer
}

// holderScript is a python3 workload holding one kind of kernel state a checkpoint must carry
// (argv[1]: unix, tcp, flock, ghost, external) and serving probes as "holder" (see probe) with its pid, a
// token drawn at start, and what the state says now:
//   - unix: a connected pair of unix stream sockets and the listening one, bound to a path: a
//     ping over the connection is answered, and a new connection is accepted;
//   - tcp: an established TCP connection over loopback (the listener is closed): a ping over it
//     is answered;
//   - flock: an exclusive flock on /tmp/holder.lock: another open file description cannot take it;
//   - ghost: a file written then unlinked while open: its content, read through the descriptor;
//   - external: a connection to a unix socket outside the container, at /ext/holder.sock.
const holderScript = `
import fcntl, os, socket, sys, time, uuid

mode = sys.argv[1]
token = uuid.uuid4().hex

def exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("connection closed")
        data += chunk
    return data

if mode in ("unix", "tcp"):
    family = socket.AF_UNIX if mode == "unix" else socket.AF_INET
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind("/tmp/holder.sock" if mode == "unix" else ("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(5)
    client = socket.socket(family, socket.SOCK_STREAM)
    client.settimeout(5)
    client.connect(server.getsockname())
    peer, _ = server.accept()
    peer.settimeout(5)
    if mode == "tcp":
        server.close()
elif mode == "flock":
    held = open("/tmp/holder.lock", "w")
    fcntl.flock(held, fcntl.LOCK_EX)
elif mode == "external":
    outside = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    outside.connect("/ext/holder.sock")
elif mode == "ghost":
    ghost = open("/tmp/holder.ghost", "w+")
    ghost.write("ghost-" + token)
    ghost.flush()
    os.unlink("/tmp/holder.ghost")

def probe():
    if mode in ("unix", "tcp"):
        client.sendall(b"ping")
        peer.sendall(exact(peer, 4) + b"-pong")
        answer = exact(client, 9).decode()
        if mode == "unix":
            other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            other.settimeout(5)
            other.connect("/tmp/holder.sock")
            accepted, _ = server.accept()
            other.close()
            accepted.close()
            answer += " new-connection"
        return answer
    if mode == "flock":
        other = open("/tmp/holder.lock")
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return "lock free"
        except BlockingIOError:
            return "lock held"
        finally:
            other.close()
    if mode == "ghost":
        ghost.seek(0)
        return "%s nlink=%d" % (ghost.read(), os.fstat(ghost.fileno()).st_nlink)
    return "connected"

req, out = "/tmp/probe-holder.req", "/tmp/probe-holder.out"
while True:
    try:
        with open(req) as f:
            nonce = f.read()
    except FileNotFoundError:
        time.sleep(0.02)
        continue
    os.unlink(req)
    try:
        answer = probe()
    except Exception as e:
        answer = "error: %r" % e
    with open(out + ".new", "w") as f:
        f.write("%s pid=%d token=%s %s" % (nonce, os.getpid(), token, answer))
    os.rename(out + ".new", out)
`

// TestCheckpointTerminalNerdctl is the terminal case through nerdctl's own sessions: `nerdctl run
// -it` on a pty, a checkpoint while the session is attached (the session must work on: the task
// keeps running), and `nerdctl start -a -i --checkpoint` in a new session, whose shell holds what
// it held at the checkpoint.
func TestCheckpointTerminalNerdctl(t *testing.T) {
	e := newCkEnv(t)
	const name = "tty"
	s := startTerminal(t, e.d, 30, 100, "run", "-it", "--snapshotter", ckliteSnapshotter, "--runtime", harness.CkliteRuntime,
		"--net", "none", "--name", name, busybox.Name, "sh")
	shellState := func(s *terminal) string {
		t.Helper()
		// The marker is split in the command so that the terminal's echo of it does not match.
		s.send(t, `echo "V""AL=$X PID=$$ TTY=$(tty)"`)
		return s.expect(t, shellStateRE)[0]
	}
	s.send(t, "X="+randomTag())
	before := shellState(s)
	id := inspect(t, e.d, name, "{{.ID}}")

	mustNerdctl(t, e.d, "checkpoint", "create", name, "ck")
	e.expectCheckpoint(t, filepath.Join(e.d.Dir, "nerdctl", "checkpoints", "ck"), id)
	if got := shellState(s); got != before {
		t.Fatalf("after the checkpoint the attached session's shell says %q, want %q as before: the task did not keep running on its terminal", got, before)
	}
	s.send(t, "X=changed-after-the-checkpoint")
	if got := shellState(s); !strings.HasPrefix(got, "VAL=changed-after-the-checkpoint ") {
		t.Fatalf("the attached session's shell says %q after X changed", got)
	}

	mustNerdctl(t, e.d, "stop", "-t", "0", name)
	s.wait(t)
	// nerdctl's start re-tars the checkpoint directory into the very blob `checkpoint create`
	// released; a garbage collection still pending from that release may take it away under
	// nerdctl ("content digest ... not found"). Collect now, so none is pending.
	e.collectGarbage(t)
	restored := startTerminal(t, e.d, 30, 100, "start", "-a", "-i", "--checkpoint", "ck", name)
	if got := shellState(restored); got != before {
		t.Fatalf("the shell restored by nerdctl start --checkpoint says %q, want %q, what it held at the checkpoint", got, before)
	}
	restored.send(t, "exit 3")
	restored.wait(t)
	if code := inspect(t, e.d, name, "{{.State.ExitCode}}"); code != "3" {
		t.Fatalf("the restored shell's `exit 3` ended the container with code %s", code)
	}
}
