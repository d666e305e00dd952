//go:build linux

package snapshotter

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/core/snapshots/testsuite"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("overlay mounts need root")
	}
}

// TestSuite runs containerd's snapshotter conformance suite in-process, through containerd's gRPC
// snapshot proxy (as containerd talks to cklite-snapshotter), and with a fan-out small enough that
// its 128-layer case reads through merges of merges.
//
// The suite renames a lower directory in its Rename case unless the snapshotter is called
// "overlayfs"; without overlayfs redirect_dir that fails with EXDEV for containerd's overlayfs
// snapshotter and for cklite alike. On such kernels the suite runs in its overlayfs mode and
// TestRenameLowerDirectory pins the EXDEV down instead.
func TestSuite(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name string
		new  testsuite.SnapshotterFunc
	}{
		{"InProcess", newInProcess()},
		{"Proxy", newThroughProxy},
		{"FanOut2", newInProcess(WithMergeFanOut(2))},
		{"Dedup", newInProcess(WithDedup)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "cklite"
			if !redirectDirEnabled() {
				name = "overlayfs"
			}
			testsuite.SnapshotterSuite(t, name, tc.new)
		})
	}
}

func newInProcess(opts ...Opt) testsuite.SnapshotterFunc {
	return func(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
		s, err := New(ctx, root, opts...)
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	}
}

func newThroughProxy(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
	s, err := New(ctx, root)
	if err != nil {
		return nil, nil, err
	}
	sock := filepath.Join(root, "snapshotter.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	server := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(server, snapshotservice.FromSnapshotter(s))
	go server.Serve(l) //nolint:errcheck
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		server.Stop()
		s.Close()
		return nil, nil, err
	}
	client := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "cklite")
	return client, func() error {
		conn.Close()
		server.Stop()
		return s.Close()
	}, nil
}

func redirectDirEnabled() bool {
	b, err := os.ReadFile("/sys/module/overlay/parameters/redirect_dir")
	return err == nil && len(b) > 0 && b[0] == 'Y'
}
