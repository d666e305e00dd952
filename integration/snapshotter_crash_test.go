package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cklite/cklite/integration/harness"
)

// TestSnapshotterCrash kills cklite-snapshotter with SIGKILL at random points of a freeze loop
// (prepare, write through an overlay mount, commit, with views and removals and, as the chain
// grows, background merges) and restarts it, ten times. After every restart: no half-made
// snapshot or merge directory is left, every commit that returned success is there with its
// files, and every snapshot the snapshotter lists mounts.
//
// It talks to the snapshotter's socket directly, as containerd does: what containerd's own
// metadata makes of a proxy dying mid-call is containerd's business, this test is about what
// the snapshotter keeps.
func TestSnapshotterCrash(t *testing.T) {
	d := startDaemon(t, harness.Config{CkliteSnapshotter: true})
	ctx := context.Background()
	committed := []string{} // names whose Commit returned success, oldest first
	parent := ""
	for round := range 10 {
		sn, closeConn := dialSnapshotter(t, d.SnapshotterAddress)
		stop := make(chan struct{})
		done := make(chan error, 1)
		go func() { done <- freezeLoop(ctx, sn, round, &parent, &committed, stop) }()
		// Not a wait for anything: a random point in the loop to kill the snapshotter at.
		time.Sleep(time.Duration(10+rand.IntN(90)) * time.Millisecond)
		if err := d.RestartSnapshotter(true); err != nil {
			t.Fatal(err)
		}
		close(stop)
		err := <-done
		closeConn()
		t.Logf("round %d: killed after %d commits in all (loop ended with: %v)", round, len(committed), err)

		sn, closeConn = dialSnapshotter(t, d.SnapshotterAddress)
		checkConsistent(t, d, sn, committed)
		closeConn()
	}
	if len(committed) < 10 {
		t.Fatalf("only %d commits in ten rounds: the kills did not interrupt a working loop", len(committed))
	}
}

func dialSnapshotter(t *testing.T, address string) (snapshots.Snapshotter, func()) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), ckliteSnapshotter), func() { conn.Close() }
}

// freezeLoop freezes layer after layer, each adding a file named after itself, until an
// operation fails (the snapshotter died) or stop is closed.
func freezeLoop(ctx context.Context, sn snapshots.Snapshotter, round int, parent *string, committed *[]string, stop chan struct{}) error {
	dir, err := os.MkdirTemp("", "cklite-crash-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		name := fmt.Sprintf("r%d-l%d", round, i)
		mounts, err := sn.Prepare(ctx, "active-"+name, *parent)
		if err != nil {
			return err
		}
		if err := mount.All(mounts, dir); err != nil {
			return err
		}
		err = os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644)
		if err2 := mount.UnmountAll(dir, 0); err == nil {
			err = err2
		}
		if err != nil {
			return err
		}
		if err := sn.Commit(ctx, name, "active-"+name); err != nil {
			return err
		}
		*committed = append(*committed, name)
		*parent = name
		if i%3 == 0 {
			if _, err := sn.View(ctx, "view-"+name, name); err != nil {
				return err
			}
			if err := sn.Remove(ctx, "view-"+name); err != nil {
				return err
			}
		}
	}
}

func checkConsistent(t *testing.T, d *harness.Daemon, sn snapshots.Snapshotter, committed []string) {
	t.Helper()
	ctx := context.Background()
	entries, err := os.ReadDir(filepath.Join(d.Dir, "cklite-snapshotter", "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "new-") || strings.HasPrefix(e.Name(), "merging-") {
			t.Fatalf("restart left the half-made directory %s", e.Name())
		}
	}
	if len(committed) == 0 {
		return
	}
	for _, name := range committed {
		if info, err := sn.Stat(ctx, name); err != nil || info.Kind != snapshots.KindCommitted {
			t.Fatalf("committed layer %s lost after the crash: %v %v", name, info.Kind, err)
		}
	}
	// The newest layer's view shows every committed layer's file: none lost its contents.
	last := committed[len(committed)-1]
	mounts, err := sn.View(ctx, "check-"+last, last)
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Remove(ctx, "check-"+last) //nolint:errcheck
	if err := mount.WithReadonlyTempMount(ctx, mounts, func(root string) error {
		for _, name := range committed {
			if b, err := os.ReadFile(filepath.Join(root, name)); err != nil || string(b) != name {
				return fmt.Errorf("layer %s: %q %v", name, b, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("after the crash: %v", err)
	}
	// Whatever the snapshotter lists is whole: actives and views mount.
	err = sn.Walk(ctx, func(ctx context.Context, info snapshots.Info) error {
		if info.Kind == snapshots.KindCommitted {
			return nil
		}
		mounts, err := sn.Mounts(ctx, info.Name)
		if err != nil {
			return err
		}
		return mount.WithReadonlyTempMount(ctx, mounts, func(string) error { return nil })
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("a snapshot listed after the crash does not mount: %v", err)
	}
}
