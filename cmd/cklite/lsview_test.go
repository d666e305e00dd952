package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cklite/cklite/pkg/checkpoint"
	ckclient "github.com/cklite/cklite/pkg/client"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden with what the code prints")

// golden compares got with testdata/name, or with -update writes it there.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run %s -update writes it)", err, t.Name())
	}
	if got != string(want) {
		t.Fatalf("printed:\n%s\nwant (%s):\n%s", got, path, want)
	}
}

// lsTree is 15 checkpoints of 3 containers and of one that is gone: a chain deeper than the
// indentation drawn, a fork's branch, names longer than their column, a checkpoint whose parent
// is gone, expiring ones, and each container's current node.
func lsTree() *ckclient.Tree {
	const (
		agent = "4f2a9c0d1e2b3a4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4"
		web   = "9b8a7c6d5e4f30211203948576a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7"
		ctr   = "c0ffee00000000000000000000000000000000000000000000000000000000aa"
		gone  = "deadbeef0000000000000000000000000000000000000000000000000000000b"
	)
	var records []checkpoint.Record
	add := func(id, parent, container, name string, contents checkpoint.Contents, age time.Duration) *checkpoint.Record {
		records = append(records, checkpoint.Record{Meta: checkpoint.Meta{
			ID: id, Parent: parent, Container: container, Name: name, Contents: contents,
			Created: now.Add(-age), MemoryBytes: int64(len(records)+1) * 3_100_000,
		}})
		return &records[len(records)-1]
	}
	add("a10000000001", "", agent, "base", checkpoint.MemoryAndFS, 50*time.Hour)
	add("a10000000002", "a10000000001", agent, "step-1", checkpoint.MemoryAndFS, 5*time.Hour)
	add("a10000000003", "a10000000002", agent, "after-pip-install-numpy-pandas-scipy", checkpoint.MemoryAndFS, 4*time.Hour)
	prev := "a10000000003"
	for i, id := range []string{"a10000000004", "a10000000005", "a10000000006", "a10000000007", "a10000000008", "a10000000009", "a1000000000a"} {
		add(id, prev, agent, "", checkpoint.MemoryAndFS, time.Duration(180-20*i)*time.Minute)
		prev = id
	}
	add("b20000000001", "a10000000003", ctr, "", checkpoint.FSOnly, 90*time.Second)
	add("c30000000001", "", web, "v1", checkpoint.MemoryAndFS, 30*24*time.Hour)
	add("c30000000002", "c30000000001", web, "", checkpoint.MemoryOnly, 12*time.Minute).Expires = now.Add(6 * time.Hour)
	add("c30000000003", "c30000000001", web, "v2", checkpoint.MemoryAndFS, 3*time.Minute).Expires = now.Add(-time.Minute)
	add("d40000000001", "e50000000001", gone, "orphaned", checkpoint.MemoryAndFS, 2*time.Hour)

	tree := checkpoint.NewTree(records)
	tree.SetCurrent(map[string]checkpoint.Lineage{
		agent: {"a1000000000a", "a10000000009"},
		web:   {"c30000000003", "c30000000001"},
		ctr:   {"a10000000003", "a10000000002"}, // forked from the agent's third checkpoint
	})
	return &ckclient.Tree{Tree: tree, Containers: map[string]ckclient.Container{
		agent: {ID: agent, Name: "agent", Running: true},
		web:   {ID: web, Name: "web-frontend-with-a-rather-long-name", Running: true},
		ctr:   {ID: ctr},
	}}
}

func TestLsView(t *testing.T) {
	tree := lsTree()
	// A root's memory is a full dump, a child's mostly in its parent's images; the orphan's image
	// directory is gone (STORED "?").
	describe := func(r checkpoint.Record) ckclient.Checkpoint {
		v := ckclient.Checkpoint{Meta: r.Meta}
		if r.Contents.HasFS() {
			v.Filesystem = &ckclient.FSUsage{Bytes: r.MemoryBytes / 7}
		}
		stored := r.MemoryBytes / 20
		if r.Parent == "" {
			stored = r.MemoryBytes
		}
		if r.Contents.HasMemory() && r.ID != "d40000000001" {
			v.MemoryStoredBytes = &stored
		}
		return v
	}
	var out bytes.Buffer
	if err := (lsView{tree: tree, describe: describe, now: now}).write(&out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 16 {
		t.Fatalf("%d lines, want a header and 15 checkpoints:\n%s", len(lines), out.String())
	}
	for i, l := range lines {
		if n := utf8.RuneCountInString(l); n > lsWidth {
			t.Errorf("line %d is %d columns wide, more than %d:\n%s", i, n, lsWidth, l)
		}
	}
	for id, want := range map[string]string{"a1000000000a": "◀ agent", "c30000000003": "◀ web-fro", "a10000000003": "◀ c0ffee000000"} {
		found := false
		for _, l := range lines {
			found = found || (strings.Contains(l, id) && strings.Contains(l, want))
		}
		if !found {
			t.Errorf("no line marks %s as %q:\n%s", id, want, out.String())
		}
	}
	golden(t, "ls.golden", out.String())
}

func TestLsColumnsFit(t *testing.T) {
	long := strings.Repeat("x", 80)
	for _, tc := range []struct {
		name string
		rows [][]string
		want []int
	}{
		{"narrow: as wide as their cells", [][]string{{"abc", "n", "web", "1m", "1MB", "1MB", "-", "-", ""}}, []int{10, 4, 9, 3, 6, 6, 5, 7, 3}},
		{"long names shrink, the farthest above their minimum first", [][]string{{"aaaaaaaaaaaa", long, long, "1m", "1MB", "1MB", "-", "-", long}}, []int{12, 11, 14, 3, 6, 6, 5, 7, 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shown := []bool{true, true, true, true, true, true, true, true, true}
			got := fit(tc.rows, shown)
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("widths %v, want %v", got, tc.want)
				}
			}
			total := len(got)*2 - 2
			for _, w := range got {
				total += w
			}
			if total > lsWidth {
				t.Fatalf("%d columns wide", total)
			}
		})
	}
}
