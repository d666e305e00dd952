package shim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/leases"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/config"
	"github.com/cklite/cklite/pkg/criuimage"
	"github.com/cklite/cklite/pkg/paths"
)

// dedupDaemon is containerd as the deduplication sees it: this instance's directory and the
// checkpoints' leases.
type dedupDaemon struct {
	*fakeDaemon
	inst    paths.Instance
	records map[string]checkpoint.Record
}

func (d *dedupDaemon) instance(context.Context, string) (paths.Instance, error) { return d.inst, nil }
func (d *dedupDaemon) leases() (leases.Manager, error)                          { return dedupLeases{d}, nil }

type dedupLeases struct{ d *dedupDaemon }

// List answers the id== filter memoryParent sends.
func (l dedupLeases) List(_ context.Context, filters ...string) ([]leases.Lease, error) {
	var out []leases.Lease
	for _, r := range l.d.records {
		if len(filters) == 1 && filters[0] == `id=="`+checkpoint.LeaseID(r.ID)+`"` {
			lm := fakeLeases{}
			ls, err := lm.Create(context.Background(), leases.WithID(checkpoint.LeaseID(r.ID)), leases.WithLabels(map[string]string{
				checkpoint.LabelID: r.ID, checkpoint.LabelContents: string(r.Contents), checkpoint.LabelImagePath: r.ImagePath,
				checkpoint.LabelCreated: r.Created.Format(time.RFC3339Nano),
			}))
			if err != nil {
				return nil, err
			}
			out = append(out, ls)
		}
	}
	return out, nil
}

func (dedupLeases) Create(context.Context, ...leases.Opt) (leases.Lease, error) {
	panic("the deduplication creates no lease")
}
func (dedupLeases) Delete(context.Context, leases.Lease, ...leases.DeleteOpt) error {
	panic("the deduplication deletes no lease")
}
func (dedupLeases) AddResource(context.Context, leases.Lease, leases.Resource) error {
	panic("the deduplication holds nothing")
}
func (dedupLeases) DeleteResource(context.Context, leases.Lease, leases.Resource) error {
	panic("the deduplication holds nothing")
}
func (dedupLeases) ListResources(context.Context, leases.Lease) ([]leases.Resource, error) {
	panic("the deduplication holds nothing")
}

// writeCheckpoint writes checkpoint id's image directory at dir: its metadata and a one-page dump
// of process 1.
func writeCheckpoint(t *testing.T, dir, id string, contents checkpoint.Contents, lineage ...string) checkpoint.Record {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	pm := criuimage.PagemapFile{PagesID: 1, Runs: []criuimage.PageRun{{Vaddr: 0x400000, Pages: 1, Flags: criuimage.PagePresent}}}
	for name, b := range map[string][]byte{"pagemap-1.img": pm.Encode(), "pages-1.img": make([]byte, os.Getpagesize())} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m := checkpoint.Meta{ID: id, Contents: contents, Snapshotter: "cklite", Frozen: checkpoint.FrozenName(id),
		Created: time.Now(), Lineage: checkpoint.Lineage(lineage).String()}
	if err := checkpoint.Write(dir, m); err != nil {
		t.Fatal(err)
	}
	return checkpoint.Record{Meta: m, ImagePath: dir}
}

func TestDedupParent(t *testing.T) {
	for _, tc := range []struct {
		name       string
		lineage    []string
		outside    bool // the new checkpoint's directory is not in the checkpoints directory
		off        bool // dedup_memory = false
		wantParent string
		skipped    string
	}{
		{name: "the last checkpoint", lineage: []string{"a1"}, wantParent: "a1"},
		{name: "past a filesystem-only one", lineage: []string{"fs", "a1"}, wantParent: "a1"},
		{name: "past one removed", lineage: []string{"gone", "a1"}, wantParent: "a1"},
		{name: "not one a client put elsewhere", lineage: []string{"elsewhere"}, skipped: "no checkpoint of its lineage"},
		{name: "no lineage", skipped: "no checkpoint of its lineage"},
		{name: "directory a client named", lineage: []string{"a1"}, outside: true, skipped: "not in cklite's checkpoints directory"},
		{name: "turned off", lineage: []string{"a1"}, off: true, skipped: "dedup_memory = false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			inst, err := paths.NewInstance(state, "5999cdbc-dab7-47f4-9cff-f2faf32c4de5")
			if err != nil {
				t.Fatal(err)
			}
			root, _ := inst.NamespaceCheckpoints("ns")
			d := &dedupDaemon{fakeDaemon: &fakeDaemon{}, inst: inst, records: map[string]checkpoint.Record{}}
			for _, r := range []checkpoint.Record{
				writeCheckpoint(t, filepath.Join(root, "a1"), "a1", checkpoint.MemoryAndFS),
				writeCheckpoint(t, filepath.Join(root, "fs"), "fs", checkpoint.FSOnly),
				writeCheckpoint(t, filepath.Join(t.TempDir(), "elsewhere"), "elsewhere", checkpoint.MemoryAndFS),
			} {
				d.records[r.ID] = r
			}
			dir := filepath.Join(root, "b2")
			if tc.outside {
				dir = filepath.Join(t.TempDir(), "b2")
			}
			writeCheckpoint(t, dir, "b2", checkpoint.MemoryAndFS, tc.lineage...)
			s := &service{daemon: d, config: shimConfig{cfg: config.Shim{StateDir: state, DedupMemory: &[]bool{!tc.off}[0]}}}
			r := s.dedup(context.Background(), "ns", dir, false)
			if r.Parent != tc.wantParent || !strings.Contains(r.Skipped, tc.skipped) || (tc.skipped == "") != (r.Skipped == "") {
				t.Fatalf("report %+v, want parent %q, skipped for %q", r, tc.wantParent, tc.skipped)
			}
			parent, err := filepath.EvalSymlinks(filepath.Join(dir, criuimage.ParentLink))
			if tc.wantParent != "" && (err != nil || parent != d.records[tc.wantParent].ImagePath || r.InParent != 1) {
				t.Fatalf("parent link %q (%v), %d pages in parent; want %s's directory and 1", parent, err, r.InParent, tc.wantParent)
			}
			if tc.wantParent == "" && err == nil {
				t.Fatalf("linked to %s though skipped", parent)
			}
		})
	}
}
