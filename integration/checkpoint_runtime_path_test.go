package integration

import (
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/cklite/cklite/pkg/checkpoint"
)

// TestCheckpointUnderRuncName registers cklite the other way: the container's runtime is named
// io.containerd.runc.v2 and the task runs cklite's shim binary by path (the Go client's
// WithRuntimePath; the CRI plugin's runtime_path). Clients then treat the task as runc's: with an
// image path the Go client builds no checkpoint image and no rootfs diff. It is still a cklite
// checkpoint (memory and filesystem), and a rollback through the same path brings both back.
func TestCheckpointUnderRuncName(t *testing.T) {
	e := newCkEnv(t)
	const id = "runc-named"
	shim := client.WithRuntimePath(e.d.ProjectBinary("containerd-shim-cklite-v2"))
	c, err := e.d.Client().NewContainer(e.ctx, id,
		client.WithSnapshotter(ckliteSnapshotter),
		client.WithNewSnapshot(id, e.img),
		client.WithRuntime("io.containerd.runc.v2", nil),
		client.WithNewSpec(oci.WithImageConfig(e.img), counterSpec))
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.NewTask(e.ctx, cio.NullIO, shim)
	if err == nil {
		err = task.Start(e.ctx)
	}
	if err != nil {
		t.Fatalf("starting %s with cklite's shim by path: %v", id, err)
	}
	cnt := newCounter(e.d.RootfsPath(id))
	writeMarks(t, cnt.Rootfs, "runc-named")
	at := cnt.advance(t, 3)
	imagesBefore, err := e.d.Client().ImageService().List(e.ctx)
	if err != nil {
		t.Fatal(err)
	}

	dir := checkpointDir(t, e.d, id)
	start := time.Now()
	if _, err := task.Checkpoint(e.ctx, client.WithCheckpointImagePath(dir)); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	logTiming(t, "Go client checkpoint under the runc name", start)
	e.expectCheckpoint(t, dir, id)
	if imgs, err := e.d.Client().ImageService().List(e.ctx); err != nil || len(imgs) != len(imagesBefore) {
		t.Fatalf("%d images before the checkpoint, %d after (%v): under the runc name the client builds no checkpoint image", len(imagesBefore), len(imgs), err)
	}
	expectContinues(t, cnt, at)

	changeMarks(t, cnt.Rootfs, "runc-named")
	e.deleteTask(t, c)
	start = time.Now()
	if _, err := e.restore(c, nil, client.WithRestoreImagePath(dir), shim); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	logTiming(t, "Go client rollback under the runc name", start)
	expectRolledBack(t, cnt, at, "runc-named")
	if m, err := checkpoint.Read(dir); err != nil || m.Contents != checkpoint.MemoryAndFS {
		t.Fatalf("%s: %+v %v", checkpoint.MetaFile, m, err)
	}
}
