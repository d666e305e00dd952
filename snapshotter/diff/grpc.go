package diff

import (
	"context"

	diffapi "github.com/containerd/containerd/api/services/diff/v1"
	"google.golang.org/grpc"

	"github.com/containerd/containerd/v2/contrib/diffservice"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// Register serves d as containerd's diff API (containerd.services.diff.v1.Diff)
// on s, for a [proxy_plugins.NAME] entry of type "diff". Errors cross the
// wire as gRPC codes, so NotImplemented still reaches containerd's diff
// service as NotImplemented and it falls through to the next differ.
func Register(s *grpc.Server, d *Differ) {
	diffapi.RegisterDiffServer(s, &server{DiffServer: diffservice.FromApplierAndComparer(d, d)})
}

// server makes the request's namespace and lease, which arrive as incoming
// gRPC metadata, outgoing too, so that the content store client Compare
// uploads through (a client of containerd's content service) sends them on.
// containerd's own gRPC server does the same for the namespace in its
// unaryNamespaceInterceptor; Register cannot add an interceptor to a server
// it did not create.
type server struct {
	diffapi.DiffServer
}

func (s *server) Diff(ctx context.Context, req *diffapi.DiffRequest) (*diffapi.DiffResponse, error) {
	if ns, ok := namespaces.Namespace(ctx); ok {
		ctx = namespaces.WithNamespace(ctx, ns)
	}
	if lease, ok := leases.FromContext(ctx); ok {
		ctx = leases.WithLease(ctx, lease)
	}
	return s.DiffServer.Diff(ctx, req)
}
