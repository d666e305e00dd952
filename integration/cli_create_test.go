package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/cklite/cklite/integration/workload"
	"github.com/cklite/cklite/pkg/checkpoint"
)

// createdID is the id `cklite checkpoint create` prints.
var createdID = regexp.MustCompile(`checkpoint ([0-9a-f]{12}) \(([a-z+]+)\) of `)

// TestCLICreate is `cklite checkpoint create` for each contents, its refusals, and `cklite
// checkpoint prune` removing the checkpoints whose image directory went.
func TestCLICreate(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "cli-create")
	dirs := map[checkpoint.Contents]string{}
	for _, tc := range []struct {
		flags []string
		want  checkpoint.Contents
		ttl   time.Duration
	}{
		{want: checkpoint.MemoryAndFS},
		{flags: []string{"--fs-only"}, want: checkpoint.FSOnly},
		{flags: []string{"--memory-only", "--ttl", "1h"}, want: checkpoint.MemoryOnly, ttl: time.Hour},
	} {
		t.Run(string(tc.want), func(t *testing.T) {
			at := cnt.advance(t, 2)
			dir := checkpointDir(t, e.d, "cli-"+strings.ReplaceAll(string(tc.want), "+", ""))
			start := time.Now()
			out := cklite(t, e.d, append(append([]string{"checkpoint", "create"}, tc.flags...), "--image-path", dir, c.ID())...)
			logTiming(t, "cklite checkpoint create "+strings.Join(tc.flags, " "), start)
			m := createdID.FindStringSubmatch(out)
			if m == nil || m[2] != string(tc.want) {
				t.Fatalf("cklite checkpoint create printed %q, want a checkpoint id and contents %s", out, tc.want)
			}
			meta, err := checkpoint.Read(dir)
			if err != nil || meta.ID != m[1] || meta.Contents != tc.want {
				t.Fatalf("%s in %s: %+v %v, want checkpoint %s with contents %s", checkpoint.MetaFile, dir, meta, err, m[1], tc.want)
			}
			if r := e.record(t, meta.ID); r.ImagePath != dir {
				t.Fatalf("checkpoint %s records image directory %q, want %q", meta.ID, r.ImagePath, dir)
			}
			if ttl := meta.Expires.Sub(meta.Created); meta.Expires.IsZero() && tc.ttl != 0 || !meta.Expires.IsZero() && ttl != tc.ttl {
				t.Fatalf("checkpoint %s expires %v after its creation, want %v", meta.ID, ttl, tc.ttl)
			}
			// The labels asked for this checkpoint only: the container is as it was.
			labels, err := c.Labels(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := labels[checkpoint.ContentsKey]; ok {
				t.Fatalf("the container kept label %s=%s after the checkpoint", checkpoint.ContentsKey, v)
			}
			e.expectStatus(t, task, client.Running, "after cklite checkpoint create")
			expectContinues(t, cnt, at)
			dirs[tc.want] = dir
		})
	}

	ckliteMisuse(t, e.d, "exclude each other", "checkpoint", "create", "--fs-only", "--memory-only", c.ID())
	ckliteFails(t, e.d, "no-such-container", "checkpoint", "create", "no-such-container")

	t.Run("--exit", func(t *testing.T) {
		dir := checkpointDir(t, e.d, "cli-exit")
		cklite(t, e.d, "checkpoint", "create", "--exit", "--image-path", dir, c.ID())
		waitForExit(t, e.ctx, task)
		task = e.rollback(t, c, dir)
		cnt.waitFor(t, "the counter counting again", func(workload.Count) bool { return true })
	})

	t.Run("prune", func(t *testing.T) {
		before := len(e.records(t))
		gone := dirs[checkpoint.FSOnly]
		if err := os.RemoveAll(gone); err != nil {
			t.Fatal(err)
		}
		out := cklite(t, e.d, "checkpoint", "prune", "--dry-run")
		if !strings.Contains(out, "would remove") || !strings.Contains(out, filepath.Base(gone)) {
			t.Fatalf("prune --dry-run printed %q, want the checkpoint whose directory %s is gone", out, gone)
		}
		if after := len(e.records(t)); after != before {
			t.Fatalf("prune --dry-run removed %d checkpoints", before-after)
		}
		out = cklite(t, e.d, "checkpoint", "prune", "--gc")
		if !strings.Contains(out, "1 of ") {
			t.Fatalf("prune printed %q, want one checkpoint removed", out)
		}
		if after := len(e.records(t)); after != before-1 {
			t.Fatalf("%d checkpoints before prune, %d after, want one fewer", before, after)
		}
		for contents, dir := range dirs {
			if dir == gone {
				continue
			}
			if m, err := checkpoint.Read(dir); err != nil {
				t.Fatalf("the %s checkpoint's directory: %v", contents, err)
			} else {
				e.record(t, m.ID) // still there
			}
		}
	})
}

// TestCLIRollback is `cklite rollback`: the running task is rolled back in place, memory and
// files, and keeps its network namespace and stdio; a paused task comes back paused; an unknown
// checkpoint changes nothing.
func TestCLIRollback(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "rollback")
	writeMarks(t, cnt.Rootfs, "rb")
	at := cnt.advance(t, 3)
	dir := checkpointDir(t, e.d, "rb")
	out := cklite(t, e.d, "checkpoint", "create", "--image-path", dir, c.ID())
	m := createdID.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("cklite checkpoint create printed %q", out)
	}
	cnt.advance(t, 3)
	changeMarks(t, cnt.Rootfs, "rb")
	pid := pidOf(t, e, task)
	netns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}

	ckliteFails(t, e.d, "zzzz", "rollback", c.ID(), "zzzz")
	cnt.advance(t, 1) // the refused rollback left the task counting

	for round := range 3 {
		start := time.Now()
		cklite(t, e.d, "rollback", c.ID(), m[1][:8])
		logTiming(t, "cklite rollback (in place)", start)
		expectRolledBack(t, cnt, at, "rb")
		now := pidOf(t, e, task)
		if now == pid {
			t.Fatalf("round %d: init kept pid %d: it was not restored", round, pid)
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", now)); err != nil || ns != netns {
			t.Fatalf("round %d: network namespace %s (%v) after the rollback, want %s as before", round, ns, err, netns)
		}
		e.expectStatus(t, task, client.Running, "after an in-place rollback")
		pid = now
		changeMarks(t, cnt.Rootfs, "rb")
	}

	// Paused, it stays paused, and then counts on from the checkpoint.
	if err := task.Pause(e.ctx); err != nil {
		t.Fatal(err)
	}
	cklite(t, e.d, "rollback", c.ID(), m[1])
	e.expectStatus(t, task, client.Paused, "after rolling a paused task back")
	if err := task.Resume(e.ctx); err != nil {
		t.Fatal(err)
	}
	expectRolledBack(t, cnt, at, "rb")
}
