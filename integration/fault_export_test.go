package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

// The "export" rounds kill `cklite checkpoint export` (pkg/fault's export points): what it leaves
// must not pass for the image (no image record, no archive at the path asked for), the checkpoint
// stays listed and restorable (the round checks), and the export run again succeeds, with an
// archive that import takes.

// exportRef and exportArchive are what a round's export of container id writes.
func exportRef(id string) string { return "localhost/cklite/fault:" + id }

func (e *faultEnv) exportArchive(id string) string {
	return filepath.Join(e.d.Dir, "exports", id+".tar")
}

// export runs cklite checkpoint export of checkpoint ck of container id, with an archive.
func (e *faultEnv) export(id, ck string) error {
	if err := os.MkdirAll(filepath.Dir(e.exportArchive(id)), 0o755); err != nil {
		return err
	}
	_, err := e.d.Cklite(e.ctx, "checkpoint", "export", "--ref", exportRef(id), "-o", e.exportArchive(id), ck)
	return err
}

// expectExportRerun checks what the killed export of checkpoint ck of container id left, runs it
// again, imports its archive, and removes both images.
func (e *faultEnv) expectExportRerun(t *testing.T, id, ck string) {
	t.Helper()
	is := e.d.Client().ImageService()
	if img, err := is.Get(e.ctx, exportRef(id)); !errdefs.IsNotFound(err) {
		t.Fatalf("the killed export left image %s (%v)", img.Name, err)
	}
	archive := e.exportArchive(id)
	if _, err := os.Stat(archive); !os.IsNotExist(err) {
		t.Fatalf("the killed export left an archive at %s (%v)", archive, err)
	}
	if err := e.export(id, ck); err != nil {
		t.Fatalf("the export run again: %v", err)
	}
	if _, err := os.Stat(archive + ".partial"); !os.IsNotExist(err) {
		t.Fatalf("the export run again left %s.partial (%v)", archive, err)
	}
	if err := is.Delete(e.ctx, exportRef(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Cklite(e.ctx, "checkpoint", "import", "--snapshotter", ckliteSnapshotter, archive); err != nil {
		t.Fatalf("import of the archive of the export run again: %v", err)
	}
	if _, err := is.Get(e.ctx, exportRef(id)); err != nil {
		t.Fatalf("the import of %s made no image %s: %v", archive, exportRef(id), err)
	}
	if err := is.Delete(e.ctx, exportRef(id)); err != nil {
		t.Fatal(fmt.Errorf("removing the imported image: %w", err))
	}
	if err := os.Remove(archive); err != nil {
		t.Fatal(err)
	}
}
