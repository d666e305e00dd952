package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/client"
	"github.com/moby/sys/mountinfo"
)

// projectFiles is how many files TestRollbackInPlaceRootfs reads through the rootfs before each
// rollback: a project an agent works on, whose dentries and inodes the mount caches.
const projectFiles = 500

// TestRollbackInPlaceRootfs rolls a task back in place three times, each after its files were
// changed and a project of projectFiles files read through its rootfs. A rollback detaches the
// old rootfs mount and ends it after its answer (shim/container.go detachRootfs): after each,
// the rootfs is exactly one mount, the overlay of the key the container's record names (neither
// the old mount nor one under the new is left there), the files and the counter are the
// checkpoint's, and the replaced key goes once its mount has ended: the snapshots are again
// those of before the rollback.
func TestRollbackInPlaceRootfs(t *testing.T) {
	e := newCkEnv(t)
	c, task, cnt := e.startCounter(t, "detach")
	writeProject(t, cnt.Rootfs)
	dir, _, at := e.markedCheckpoint(t, task, cnt, "base")
	before := len(e.snapshotNames(t))
	for i := range 3 {
		changeMarks(t, cnt.Rootfs, fmt.Sprint(i))
		readProject(t, cnt.Rootfs)
		cnt.advance(t, 2)
		e.rollbackInPlace(t, task, dir)
		expectRolledBack(t, cnt, at, "base")
		e.expectRootfsMount(t, c, cnt.Rootfs)
		eventually(t, "the replaced rootfs key's removal", func() error {
			if n := len(e.snapshotNames(t)); n != before {
				return fmt.Errorf("%d snapshots after rollback %d, %d before the first", n, i+1, before)
			}
			return nil
		})
	}
}

// writeProject writes projectFiles small files into /project of rootfs.
func writeProject(t *testing.T, rootfs string) {
	t.Helper()
	dir := filepath.Join(rootfs, "project")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range projectFiles {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), []byte(fmt.Sprintf("file %d\n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// readProject reads every file of rootfs's /project.
func readProject(t *testing.T, rootfs string) {
	t.Helper()
	for i := range projectFiles {
		name := filepath.Join(rootfs, "project", fmt.Sprintf("f%04d", i))
		if b, err := os.ReadFile(name); err != nil || string(b) != fmt.Sprintf("file %d\n", i) {
			t.Fatalf("%s: %q, %v", name, b, err)
		}
	}
}

// expectRootfsMount fails unless rootfs is exactly one mount, the overlay whose upper is that of
// the snapshot key container c's record names.
func (e *ckEnv) expectRootfsMount(t *testing.T, c client.Container, rootfs string) {
	t.Helper()
	info, err := c.Info(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := e.sn.Mounts(e.ctx, info.SnapshotKey)
	if err != nil || len(ms) != 1 {
		t.Fatalf("mounts of %s: %v, %v", info.SnapshotKey, ms, err)
	}
	var upper string
	for _, o := range ms[0].Options {
		if u, ok := strings.CutPrefix(o, "upperdir="); ok {
			upper = u
		}
	}
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(rootfs))
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 1 || mounts[0].FSType != "overlay" || upper == "" ||
		!slices.Contains(strings.Split(mounts[0].VFSOptions, ","), "upperdir="+upper) {
		var seen []string
		for _, m := range mounts {
			seen = append(seen, m.FSType+" "+m.VFSOptions)
		}
		t.Fatalf("the rootfs %s is mounted %d times (%v), want once, the overlay of key %s (upper %s)", rootfs, len(mounts), seen, info.SnapshotKey, upper)
	}
}
