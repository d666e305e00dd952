package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/api/services/tasks/v1"
	taskapi "github.com/containerd/containerd/api/types/task"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cklite/cklite/integration/harness"
	ckclient "github.com/cklite/cklite/pkg/client"
	"github.com/cklite/cklite/pkg/podckpt"
)

// The two containers of TestCRIPodCheckpoint's pod share /shared, a host directory as a kubelet's
// emptyDir is. The writer appends 1, 2, 3... to /shared/seq, its counter in shell memory, until
// /shared/stop exists, and writes "TOKEN I" to /tmp/a in its rootfs. The reader keeps
// /shared/seq open and counts, in memory, the lines it has read (each must be its own number,
// else it notes it in /tmp/bad) and writes "TOKEN N" to /tmp/count. TOKEN is drawn at start: a
// restarted process shows a new one.
const (
	podWriterScript = `t=$(cat /proc/sys/kernel/random/uuid); i=0
while :; do
  if [ ! -e /shared/stop ]; then i=$((i+1)); echo $i >> /shared/seq; echo "$t $i" > /tmp/a.new && mv /tmp/a.new /tmp/a; fi
  sleep 0.02
done`
	podReaderScript = `t=$(cat /proc/sys/kernel/random/uuid); n=0
while [ ! -e /shared/seq ]; do sleep 0.02; done
exec 3< /shared/seq
while :; do
  while read -r l <&3; do n=$((n+1)); [ "$l" = "$n" ] || echo "$n $l" >> /tmp/bad; done
  echo "$t $n" > /tmp/count.new && mv /tmp/count.new /tmp/count
  sleep 0.02
done`
)

// TestCRIPodCheckpoint checkpoints a two-container CRI pod at one instant with `cklite pod
// checkpoint` (one id, listed by checkpoint ls, its members labelled), lets both run on and
// change, restores it in place with `cklite pod restore`, removes the pod (prune --orphaned must
// keep the members) and forks the checkpoint with `cklite pod fork`, and removes it (pod rm),
// then the fork's pod (prune --orphaned removes its volume copies).
// Each time the pod must come back as it was at that one instant: the shared directory's
// sequence, the writer's counter in memory and the reader's count and file offset in memory must
// agree exactly (once the writer is stopped, the sequence is 1..N without gap or repeat, the
// writer's last number is N and the reader has read N lines, each its own number), with the
// processes' tokens from before the checkpoint, and the changes made after it gone.
func TestCRIPodCheckpoint(t *testing.T) {
	d, cri := startCRI(t)
	ctx := criContext(t)
	shared := filepath.Join(d.Dir, "pods", "duo-shared")
	if err := os.MkdirAll(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	pod, err := cri.RunPod(ctx, "duo", harness.HandlerCklite, true)
	if err != nil {
		t.Fatal(err)
	}
	// Pods go through CRI, as the kubelet removes them (the test removes this one midway).
	t.Cleanup(func() { _ = cri.RemovePod(context.Background(), pod) })
	start := func(name, script string) string {
		cfg := pod.Container(name, busybox.Name, "sh", "-c", script)
		cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/shared", HostPath: shared}}
		id, err := cri.StartContainer(ctx, pod, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	orig := duo{cri: cri, shared: shared, writer: start("writer", podWriterScript), reader: start("reader", podReaderScript)}
	before := orig.waitRead(t, 20)

	id := strings.TrimSpace(ckliteCRI(t, cri, "pod", "checkpoint", "-q", "--volume", shared, "duo"))
	rec := podCheckpointRecord(t, cri, id)
	if len(rec.Members) != 2 || len(rec.Volumes) != 1 || rec.Volumes[0].HostPath != shared || rec.Sandbox != pod.ID {
		t.Fatalf("pod checkpoint %s records %+v", id, rec)
	}
	t.Logf("pod checkpoint %s: frozen %d ms, volume %d files, %d bytes copied in %d µs (%d reflinked)",
		id, rec.FrozenMs, rec.Volumes[0].Files, rec.Volumes[0].Bytes, rec.Volumes[0].TookNs/1000, rec.Volumes[0].Cloned)
	atCheckpoint := readSeq(t, filepath.Join(rec.CopyDir(rec.Volumes[0]), "seq"))
	expectPodListed(t, cri, rec)

	// Both run on, and change: more lines, a file in the volume and one in each rootfs.
	orig.waitRead(t, atCheckpoint+10)
	if after := orig.tokens(t); after != before {
		t.Fatalf("the pod's processes changed across its checkpoint: %v, then %v", before, after)
	}
	orig.mark(t)

	ckliteCRI(t, cri, "pod", "restore", id)
	orig.expectUnmarked(t)
	orig.expectAgree(t, before, atCheckpoint)

	// The pod goes; its checkpoint holds its members against prune --orphaned, and forks.
	origLines := readSeq(t, filepath.Join(shared, "seq"))
	if err := cri.RemovePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if pruned := strings.Fields(ckliteCRI(t, cri, "checkpoint", "prune", "--orphaned", "-q")); slices.ContainsFunc(rec.Checkpoints(), func(id string) bool { return slices.Contains(pruned, id) }) {
		t.Fatalf("checkpoint prune --orphaned removed members of pod checkpoint %s: %v", id, pruned)
	}

	var forked ckclient.PodRestored
	if err := json.Unmarshal([]byte(ckliteCRI(t, cri, "pod", "fork", "--format", "json", id)), &forked); err != nil {
		t.Fatal(err)
	}
	forkPod := &harness.Pod{ID: forked.Sandbox}
	t.Cleanup(func() { _ = cri.RemovePod(context.Background(), forkPod) }) // the test removes it at the end
	fork := duo{cri: cri, shared: forked.Volumes[shared], writer: forked.Containers["writer"], reader: forked.Containers["reader"]}
	if forked.Sandbox == pod.ID || fork.shared == shared || fork.shared == "" || fork.writer == orig.writer || fork.reader == orig.reader {
		t.Fatalf("the fork shares the pod's sandbox, volume or containers: %+v", forked)
	}
	fork.expectUnmarked(t)
	fork.expectAgree(t, before, atCheckpoint)
	if got := readSeq(t, filepath.Join(shared, "seq")); got != origLines {
		t.Errorf("the removed pod's volume went from %d to %d lines while its fork ran", origLines, got)
	}

	// pod rm: the record, its members and its directory go, and the volumes of a fork whose pod
	// is gone (one left, say, by a fork whose pod was removed before); the fork runs on, on its
	// volume.
	gone := podckpt.ForkDir(filepath.Dir(rec.Dir), "0123456789abcdef")
	if err := os.MkdirAll(filepath.Join(gone, "0"), 0o700); err != nil {
		t.Fatal(err)
	}
	ckliteCRI(t, cri, "pod", "rm", id)
	if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("volumes of a gone pod fork, %s, after pod rm: %v", gone, err)
	}
	if ids := strings.Fields(ckliteCRI(t, cri, "pod", "ls", "-q")); slices.Contains(ids, id) {
		t.Errorf("pod ls lists %s after pod rm: %v", id, ids)
	}
	if left := strings.TrimSpace(ckliteCRI(t, cri, "checkpoint", "ls", "-q", "--label", podckpt.LabelPod+"="+id)); left != "" {
		t.Errorf("members of %s left after pod rm: %s", id, left)
	}
	if _, err := os.Stat(rec.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pod checkpoint directory %s after pod rm: %v", rec.Dir, err)
	}
	for _, cid := range []string{fork.writer, fork.reader} {
		if st, err := cri.ContainerState(ctx, cid); err != nil || st != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("fork's container %s after pod rm: %v, %v", cid, st, err)
		}
	}
	if _, err := seqLines(filepath.Join(fork.shared, "seq")); err != nil {
		t.Errorf("the running fork's volume after pod rm: %v", err)
	}

	// The fork's pod goes: checkpoint prune --orphaned removes its volumes.
	if err := cri.RemovePod(ctx, forkPod); err != nil {
		t.Fatal(err)
	}
	ckliteCRI(t, cri, "checkpoint", "prune", "--orphaned")
	if _, err := os.Stat(fork.shared); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("volume %s of the removed fork's pod after checkpoint prune --orphaned: %v", fork.shared, err)
	}
}

// duo is TestCRIPodCheckpoint's pod: its two containers and the host directory they share.
type duo struct {
	cri                    *harness.CRI
	shared, writer, reader string
}

// duoTokens are the tokens of the writer and the reader.
type duoTokens struct{ writer, reader string }

// readState parses "TOKEN N" from file of container id's rootfs.
func (p duo) readState(id, file string) (string, int, error) {
	b, err := os.ReadFile(filepath.Join(p.cri.RootfsPath(id), "tmp", file))
	if err != nil {
		return "", 0, err
	}
	tok, n, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
	count, err := strconv.Atoi(n)
	if !ok || err != nil {
		return "", 0, fmt.Errorf("/tmp/%s of %s: %q", file, id, b)
	}
	return tok, count, nil
}

// waitRead waits until the reader has read at least n lines and returns both tokens.
func (p duo) waitRead(t *testing.T, n int) duoTokens {
	t.Helper()
	eventually(t, fmt.Sprintf("the reader to read %d lines", n), func() error {
		_, got, err := p.readState(p.reader, "count")
		if err == nil && got < n {
			err = fmt.Errorf("it has read %d", got)
		}
		return err
	})
	return p.tokens(t)
}

func (p duo) tokens(t *testing.T) duoTokens {
	t.Helper()
	w, _, err := p.readState(p.writer, "a")
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := p.readState(p.reader, "count")
	if err != nil {
		t.Fatal(err)
	}
	return duoTokens{w, r}
}

// mark leaves a file in the volume and in each container's rootfs, which a restore to a
// checkpoint taken before must remove.
func (p duo) mark(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(p.shared, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{p.writer, p.reader} {
		if _, err := p.cri.Exec(criContext(t), id, "touch", "/tmp/marker"); err != nil {
			t.Fatal(err)
		}
	}
}

func (p duo) expectUnmarked(t *testing.T) {
	t.Helper()
	for _, path := range []string{
		filepath.Join(p.shared, "marker"),
		filepath.Join(p.cri.RootfsPath(p.writer), "tmp", "marker"),
		filepath.Join(p.cri.RootfsPath(p.reader), "tmp", "marker"),
	} {
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s, made after the checkpoint, is there after the restore (%v)", path, err)
		}
	}
}

// expectAgree checks a pod restored from the checkpoint at which the volume held atCheckpoint
// lines: its processes are the checkpointed ones (tokens), run on past it, and once the writer
// is stopped the volume, the writer's counter and the reader's count agree exactly.
func (p duo) expectAgree(t *testing.T, want duoTokens, atCheckpoint int) {
	t.Helper()
	if got := p.waitRead(t, atCheckpoint+5); got != want {
		t.Fatalf("restored pod's processes have tokens %v, the checkpointed ones %v: restarted, not restored", got, want)
	}
	if err := os.WriteFile(filepath.Join(p.shared, "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the writer's counter, the volume and the reader's count to agree", func() error {
		_, wrote, err := p.readState(p.writer, "a")
		if err != nil {
			return err
		}
		_, read, err := p.readState(p.reader, "count")
		if err != nil {
			return err
		}
		lines, err := seqLines(filepath.Join(p.shared, "seq"))
		if err != nil {
			return err
		}
		if wrote != lines || read != lines {
			return fmt.Errorf("the writer's counter is at %d, the volume has %d lines, the reader has read %d", wrote, lines, read)
		}
		return nil
	})
	if bad, err := os.ReadFile(filepath.Join(p.cri.RootfsPath(p.reader), "tmp", "bad")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the reader read lines out of sequence (line, content): %q, %v", bad, err)
	}
}

// seqLines checks that the file at path is the lines 1..N and returns N.
func seqLines(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	for i, l := range lines {
		if l != strconv.Itoa(i+1) {
			return 0, fmt.Errorf("%s: line %d is %q (%d lines): a gap or a repeat", path, i+1, l, len(lines))
		}
	}
	return len(lines), nil
}

func readSeq(t *testing.T, path string) int {
	t.Helper()
	n, err := seqLines(path)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// podCheckpointRecord is pod checkpoint id as `cklite pod ls --format json` prints it.
func podCheckpointRecord(t *testing.T, cri *harness.CRI, id string) podckpt.Record {
	t.Helper()
	var all []struct {
		podckpt.Record
		Dir string `json:"dir"`
	}
	if err := json.Unmarshal([]byte(ckliteCRI(t, cri, "pod", "ls", "--format", "json")), &all); err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.ID == id {
			r.Record.Dir = r.Dir
			return r.Record
		}
	}
	t.Fatalf("pod ls does not list %s: %+v", id, all)
	return podckpt.Record{}
}

// expectPodListed checks that checkpoint ls shows pod checkpoint rec with its members, and that
// its members, and only they, carry its label.
func expectPodListed(t *testing.T, cri *harness.CRI, rec podckpt.Record) {
	t.Helper()
	ls := ckliteCRI(t, cri, "checkpoint", "ls")
	for _, id := range append(rec.Checkpoints(), rec.ID) {
		if !strings.Contains(ls, id) {
			t.Errorf("checkpoint ls does not show %s:\n%s", id, ls)
		}
	}
	labelled := strings.Fields(ckliteCRI(t, cri, "checkpoint", "ls", "-q", "--label", podckpt.LabelPod+"="+rec.ID))
	want := rec.Checkpoints()
	slices.Sort(labelled)
	slices.Sort(want)
	if !slices.Equal(labelled, want) {
		t.Errorf("checkpoints labelled with pod checkpoint %s: %v, want its members %v", rec.ID, labelled, want)
	}
}

// ckliteCRI runs the cklite CLI in CRI's namespace and returns its output.
func ckliteCRI(t *testing.T, cri *harness.CRI, args ...string) string {
	t.Helper()
	out, err := cri.Cklite(context.Background(), args...)
	if err != nil {
		t.Fatalf("cklite %s: %v%s", strings.Join(args, " "), err, criuErrors(err))
	}
	return out
}

// TestCRIPodCheckpointRefused checks that a pod checkpoint that cannot be taken leaves the pod
// as it was: a pod on runc is refused naming its runtime before any container is frozen (its
// task still runs, its counter counts on), an unknown pod is refused, and neither leaves a pod
// checkpoint or a checkpoint listed.
func TestCRIPodCheckpointRefused(t *testing.T) {
	d, cri := startCRI(t)
	ctx := criContext(t)
	_, id := runCounterPod(t, cri, "on-runc", harness.HandlerRunc, true, false)
	c := newCounter(cri.RootfsPath(id))
	c.advance(t, 3)
	ckliteFails(t, d, "runs on io.containerd.runc.v2", "-n", harness.CRINamespace, "pod", "checkpoint", "on-runc")
	task, err := d.Client().TaskService().Get(cri.Context(ctx), &tasks.GetRequest{ContainerID: id})
	if err != nil {
		t.Fatal(err)
	}
	if st := task.GetProcess().GetStatus(); st != taskapi.Status_RUNNING {
		t.Errorf("the runc pod's task is %v after the refused pod checkpoint", st)
	}
	c.advance(t, 3)
	ckliteFails(t, d, "no ready CRI pod", "pod", "checkpoint", "no-such-pod")
	for _, args := range [][]string{{"pod", "ls", "-q"}, {"checkpoint", "ls", "-q"}} {
		if out := strings.TrimSpace(ckliteCRI(t, cri, args...)); out != "" {
			t.Errorf("cklite %s after refused pod checkpoints: %s", strings.Join(args, " "), out)
		}
	}
}
