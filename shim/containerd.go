package shim

import (
	"context"
	"fmt"
	"sync"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	leasesapi "github.com/containerd/containerd/api/services/leases/v1"
	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/containers"
	introspectionproxy "github.com/containerd/containerd/v2/core/introspection/proxy"
	"github.com/containerd/containerd/v2/core/leases"
	leasesproxy "github.com/containerd/containerd/v2/core/leases/proxy"
	"github.com/containerd/containerd/v2/core/snapshots"
	snapshotsproxy "github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/paths"
	"github.com/cklite/cklite/snapshotter/freeze"
)

// daemonClient is what the shim asks of containerd beyond the task API (daemon below): the seam
// where unit tests put a fake.
type daemonClient interface {
	dial() (*grpc.ClientConn, error)
	containerRootfs(ctx context.Context, ns, id string) (rootfsSnapshot, error)
	setLineage(ctx context.Context, ns, id string, l checkpoint.Lineage) error
	snapshotter(name string) (snapshots.Snapshotter, error)
	containers() (freeze.Containers, error)
	leases() (leases.Manager, error)
	instance(ctx context.Context, stateDir string) (paths.Instance, error)
	close()
}

var _ daemonClient = (*daemon)(nil)

// daemon is the shim's connection to containerd's gRPC API, for what a checkpoint needs beyond the
// task API: the container's rootfs snapshot (to freeze it and to stack a restore on a frozen
// layer) and the lease that keeps a checkpoint's layer. It dials on first use, so a container
// that is never checkpointed costs no connection.
type daemon struct {
	address string

	once sync.Once
	conn *grpc.ClientConn
	err  error

	uuid struct {
		sync.Mutex
		id string // containerd's, once asked
	}
}

func (d *daemon) dial() (*grpc.ClientConn, error) {
	d.once.Do(func() {
		if d.address == "" {
			d.err = fmt.Errorf("the shim was not given containerd's address")
			return
		}
		d.conn, d.err = grpc.NewClient("unix://"+d.address, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if d.err != nil {
			d.err = fmt.Errorf("connect to containerd at %s: %w", d.address, d.err)
		}
	})
	return d.conn, d.err
}

// rootfsSnapshot is the container's record in containerd: which snapshotter and key hold its
// rootfs ("" when the container brings its own rootfs), and its labels (checkpoint requests).
type rootfsSnapshot struct {
	snapshotter, key string
	labels           map[string]string // the container's labels
}

func (d *daemon) containerRootfs(ctx context.Context, ns, id string) (rootfsSnapshot, error) {
	conn, err := d.dial()
	if err != nil {
		return rootfsSnapshot{}, err
	}
	resp, err := containersapi.NewContainersClient(conn).Get(namespaces.WithNamespace(ctx, ns), &containersapi.GetContainerRequest{ID: id})
	if err != nil {
		return rootfsSnapshot{}, fmt.Errorf("look up container %s in containerd: %w", id, errgrpc.ToNative(err))
	}
	return rootfsSnapshot{snapshotter: resp.Container.Snapshotter, key: resp.Container.SnapshotKey, labels: resp.Container.Labels}, nil
}

// setLineage records l as container id's lineage (checkpoint.LineageKey), changing no other label.
func (d *daemon) setLineage(ctx context.Context, ns, id string, l checkpoint.Lineage) error {
	conn, err := d.dial()
	if err != nil {
		return err
	}
	_, err = containersapi.NewContainersClient(conn).Update(namespaces.WithNamespace(ctx, ns), &containersapi.UpdateContainerRequest{
		Container:  &containersapi.Container{ID: id, Labels: map[string]string{checkpoint.LineageKey: l.String()}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels." + checkpoint.LineageKey}},
	})
	if err != nil {
		return fmt.Errorf("record the lineage of container %s: %w", id, errgrpc.ToNative(err))
	}
	return nil
}

func (d *daemon) snapshotter(name string) (snapshots.Snapshotter, error) {
	conn, err := d.dial()
	if err != nil {
		return nil, err
	}
	return snapshotsproxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), name), nil
}

// containers is containerd's container store, for a switch of a container's rootfs snapshot.
func (d *daemon) containers() (freeze.Containers, error) {
	conn, err := d.dial()
	if err != nil {
		return nil, err
	}
	return containerStore{containersapi.NewContainersClient(conn)}, nil
}

// containerStore is the part of containerd's container API a switch uses (freeze.Containers), on
// the shim's connection: what containerd's client package offers, without that package.
type containerStore struct {
	c containersapi.ContainersClient
}

func (s containerStore) Get(ctx context.Context, id string) (containers.Container, error) {
	resp, err := s.c.Get(ctx, &containersapi.GetContainerRequest{ID: id})
	if err != nil {
		return containers.Container{}, errgrpc.ToNative(err)
	}
	c := resp.Container
	return containers.Container{ID: c.ID, Labels: c.Labels, Snapshotter: c.Snapshotter, SnapshotKey: c.SnapshotKey}, nil
}

// Update updates the fields of c that fieldpaths name; only the snapshot key and labels are
// sent, all a switch changes.
func (s containerStore) Update(ctx context.Context, c containers.Container, fieldpaths ...string) (containers.Container, error) {
	_, err := s.c.Update(ctx, &containersapi.UpdateContainerRequest{
		Container:  &containersapi.Container{ID: c.ID, Labels: c.Labels, SnapshotKey: c.SnapshotKey},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: fieldpaths},
	})
	if err != nil {
		return containers.Container{}, errgrpc.ToNative(err)
	}
	return c, nil
}

func (d *daemon) leases() (leases.Manager, error) {
	conn, err := d.dial()
	if err != nil {
		return nil, err
	}
	return leasesproxy.NewLeaseManager(leasesapi.NewLeasesClient(conn)), nil
}

// instance is this containerd's directory of cklite state below stateDir (pkg/paths). The UUID
// is asked of containerd on first use: it does not change while a shim lives.
func (d *daemon) instance(ctx context.Context, stateDir string) (paths.Instance, error) {
	d.uuid.Lock()
	defer d.uuid.Unlock()
	if d.uuid.id != "" {
		return paths.NewInstance(stateDir, d.uuid.id)
	}
	conn, err := d.dial()
	if err != nil {
		return paths.Instance{}, err
	}
	inst, err := paths.ForContainerd(ctx, stateDir, introspectionproxy.NewIntrospectionProxy(conn))
	if err != nil {
		return paths.Instance{}, err
	}
	d.uuid.id = inst.UUID
	return inst, nil
}

func (d *daemon) close() {
	if d.conn != nil {
		d.conn.Close()
	}
}
