package diff

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	diffapi "github.com/containerd/containerd/api/services/diff/v1"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	diffproxy "github.com/containerd/containerd/v2/core/diff/proxy"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// headerStore records the gRPC metadata a content store client would send
// with each upload.
type headerStore struct {
	content.Store
	sent []metadata.MD
}

func (s *headerStore) Writer(ctx context.Context, opts ...content.WriterOpt) (content.Writer, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	s.sent = append(s.sent, md)
	return s.Store.Writer(ctx, opts...)
}

// fakeLeases records the leases Compare takes.
type fakeLeases struct {
	leases.Manager
	created []leases.Lease
}

func (m *fakeLeases) Create(ctx context.Context, opts ...leases.Opt) (leases.Lease, error) {
	var l leases.Lease
	for _, o := range opts {
		if err := o(&l); err != nil {
			return leases.Lease{}, err
		}
	}
	m.created = append(m.created, l)
	return l, nil
}

// serve serves d on a unix socket as cmd/cklite-snapshotter would and
// returns containerd's own proxy differ (what containerd builds for a
// [proxy_plugins] entry of type "diff") connected to it.
func serve(t *testing.T, d *Differ) interface {
	diff.Comparer
	diff.Applier
} {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "diff.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	Register(s, d)
	go s.Serve(l)
	t.Cleanup(s.Stop)

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return diffproxy.NewDiffApplier(diffapi.NewDiffClient(conn)).(interface {
		diff.Comparer
		diff.Applier
	})
}

func TestGRPC(t *testing.T) {
	e := newEnv(t)
	e.commit(t, "base", "", func(dir string) { populateBase(t, dir) })
	lower, upper := e.active(t, "active", "base", func(dir string) { changeActive(t, dir) })
	store := &headerStore{Store: e.store}
	remote := serve(t, New(e.root, store))

	// containerd's gRPC server re-sends the client's namespace to a proxy
	// differ; the client's lease stays behind.
	ctx := leases.WithLease(namespaces.WithNamespace(context.Background(), "cklite-test"), "checkpoint-lease")
	got, err := remote.Compare(ctx, lower, upper, diff.WithReference("checkpoint-rw-active"), diff.WithLabels(map[string]string{"x": "y"}))
	if err != nil {
		t.Fatalf("Compare over gRPC: %v", err)
	}
	want, err := e.fast.Compare(context.Background(), lower, upper)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != want.Digest || got.Size != want.Size || got.MediaType != want.MediaType {
		t.Errorf("over gRPC %+v, in-process %+v", got, want)
	}
	info, err := e.store.Info(context.Background(), got.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if info.Labels["x"] != "y" {
		t.Errorf("labels %v lack the request's", info.Labels)
	}
	if len(store.sent) != 1 {
		t.Fatalf("%d uploads, want 1", len(store.sent))
	}
	if ns := store.sent[0].Get(namespaces.GRPCHeader); len(ns) != 1 || ns[0] != "cklite-test" {
		t.Errorf("upload sent namespace %v, want [cklite-test]", ns)
	}
	if lease := store.sent[0].Get("containerd-lease"); len(lease) != 1 || lease[0] != "checkpoint-lease" {
		t.Errorf("upload sent lease %v, want [checkpoint-lease]", lease)
	}

	// Fall-through and Apply keep NotImplemented across the wire, which is
	// what makes containerd's diff service try the next differ.
	if _, err := remote.Compare(ctx, nil, upper); !errdefs.IsNotImplemented(err) {
		t.Errorf("Compare of mismatched mounts over gRPC: %v, want NotImplemented", err)
	}
	if _, err := remote.Apply(ctx, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip}, upper); !errdefs.IsNotImplemented(err) {
		t.Errorf("Apply over gRPC: %v, want NotImplemented", err)
	}
}

func TestCompareTakesLeaseWhenNoneSent(t *testing.T) {
	e := newEnv(t)
	e.commit(t, "base", "", func(dir string) { populateBase(t, dir) })
	lower, upper := e.active(t, "active", "base", func(dir string) { changeActive(t, dir) })
	store := &headerStore{Store: e.store}
	lm := &fakeLeases{}
	remote := serve(t, New(e.root, store, WithLeases(lm)))

	ctx := namespaces.WithNamespace(context.Background(), "cklite-test")
	if _, err := remote.Compare(ctx, lower, upper); err != nil {
		t.Fatal(err)
	}
	if len(lm.created) != 1 || lm.created[0].ID == "" || lm.created[0].Labels["containerd.io/gc.expire"] == "" {
		t.Fatalf("leases created %+v, want one expiring lease", lm.created)
	}
	if lease := store.sent[0].Get("containerd-lease"); len(lease) != 1 || lease[0] != lm.created[0].ID {
		t.Errorf("upload sent lease %v, want [%s]", lease, lm.created[0].ID)
	}

	// A request with its own lease uses it.
	if _, err := remote.Compare(leases.WithLease(ctx, "own"), lower, upper); err != nil {
		t.Fatal(err)
	}
	if len(lm.created) != 1 {
		t.Errorf("took a lease for a request that carried one: %+v", lm.created)
	}
}
