package shim

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	cgroupsv2 "github.com/containerd/cgroups/v3/cgroup2"
	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/version"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cklite/cklite/runtime"
)

// RuntimeName is the runtime type containerd knows this shim by.
const RuntimeName = "io.containerd.cklite.v2"

// NewManager returns the shim manager: it starts one shim process per container (the
// `start` action) and cleans up after a dead one (the `delete` action).
func NewManager() shim.Shim { return manager{} }

type manager struct{}

func (manager) Name() string { return RuntimeName }

// Start launches the serving shim for a container and returns its ttrpc address. A shim
// already serving that address (containerd restarted and asks again) is reused.
func (manager) Start(ctx context.Context, opts *bootapi.BootstrapParams) (_ *bootapi.BootstrapResult, retErr error) {
	id := opts.GetInstanceID()
	socketDir := opts.GetSocketDir()
	if socketDir == "" {
		socketDir = filepath.Join(defaults.DefaultStateDir, "s")
	}
	address, err := shim.CreateSocketAddress(ctx, socketDir, opts.GetContainerdGrpcAddress(), id, false)
	if err != nil {
		return nil, err
	}
	result := &bootapi.BootstrapResult{Version: 3, Protocol: "ttrpc", Address: address}
	socket, err := shim.NewSocket(address)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return nil, fmt.Errorf("create shim socket: %w", err)
		}
		if shim.CanConnect(address) {
			return result, nil
		}
		if err := shim.RemoveSocket(address); err != nil {
			return nil, fmt.Errorf("remove stale shim socket: %w", err)
		}
		if socket, err = shim.NewSocket(address); err != nil {
			return nil, fmt.Errorf("create shim socket: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			socket.Close()
			_ = shim.RemoveSocket(address)
		}
	}()
	f, err := socket.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()

	cmd, err := serveCommand(ctx, id, opts)
	if err != nil {
		return nil, err
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	goruntime.LockOSThread()
	err = cmd.Start()
	goruntime.UnlockOSThread()
	if err != nil {
		return nil, fmt.Errorf("start shim: %w", err)
	}
	defer func() {
		if retErr != nil {
			_ = cmd.Process.Kill()
		}
	}()
	go cmd.Wait() //nolint:errcheck // the shim outlives this process; reap it if it dies first

	if err := joinShimCgroup(opts, cmd.Process.Pid); err != nil {
		return nil, err
	}
	if err := shim.AdjustOOMScore(cmd.Process.Pid); err != nil {
		return nil, fmt.Errorf("adjust shim OOM score: %w", err)
	}
	return result, nil
}

// serveCommand is this binary without an action: pkg/shim then serves the inherited socket.
func serveCommand(ctx context.Context, id string, opts *bootapi.BootstrapParams) (*exec.Cmd, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-id", id, "-address", opts.GetContainerdGrpcAddress()}
	if opts.GetLogLevel() <= bootapi.LogLevel_LOG_LEVEL_DEBUG {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// joinShimCgroup honours runc Options.ShimCgroup, as runc-v2 does.
func joinShimCgroup(opts *bootapi.BootstrapParams, pid int) error {
	var o options.Options
	found, err := opts.FindExtension(&o)
	if err != nil {
		return fmt.Errorf("read runtime options: %w", err)
	}
	if !found || o.ShimCgroup == "" {
		return nil
	}
	if cgroups.Mode() == cgroups.Unified {
		cg, err := cgroupsv2.Load(o.ShimCgroup)
		if err != nil {
			return fmt.Errorf("load shim cgroup %s: %w", o.ShimCgroup, err)
		}
		return cg.AddProc(uint64(pid))
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(o.ShimCgroup))
	if err != nil {
		return fmt.Errorf("load shim cgroup %s: %w", o.ShimCgroup, err)
	}
	return cg.AddProc(uint64(pid))
}

// Stop cleans up after a shim that is gone, whenever it died (recover.go): kill and destroy the
// container, unmount its rootfs and report the init's exit (recorded in the bundle when the shim saw it, else SIGKILL).
func (manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	bundle, err := os.Getwd()
	if err != nil {
		return shim.StopStatus{}, err
	}
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return shim.StopStatus{}, err
	}
	opts, err := readOptions(bundle)
	if err != nil {
		return shim.StopStatus{}, err
	}
	pid, _ := recoverContainer(ctx, bundle, stateRoot(opts, ns), id)
	stopped := time.Now()
	if err := mount.UnmountRecursive(filepath.Join(bundle, "rootfs"), 0); err != nil {
		log.G(ctx).WithError(err).Warn("unmount rootfs")
	}
	if e, err := readExit(bundle); err == nil {
		return shim.StopStatus{Pid: e.Pid, ExitStatus: e.Status, ExitedAt: e.Timestamp}, nil
	}
	return shim.StopStatus{Pid: pid, ExitStatus: 128 + int(unix.SIGKILL), ExitedAt: stopped}, nil
}

// Info describes the runtime: name, version, options and the engine's features (computed
// in-process: there is no runc binary to ask).
func (m manager) Info(ctx context.Context, optionsR io.Reader) (*types.RuntimeInfo, error) {
	info := &types.RuntimeInfo{
		Name:    m.Name(),
		Version: &types.RuntimeVersion{Version: version.Version, Revision: version.Revision},
	}
	opts, err := readInfoOptions(optionsR)
	if err != nil {
		return nil, fmt.Errorf("read runtime options: %w", err)
	}
	if opts != nil {
		if info.Options, err = typeurl.MarshalAnyToProto(opts); err != nil {
			return nil, fmt.Errorf("marshal %T: %w", opts, err)
		}
	}
	if info.Features, err = typeurl.MarshalAnyToProto(runtime.Features()); err != nil {
		return nil, fmt.Errorf("marshal features: %w", err)
	}
	return info, nil
}

// readInfoOptions reads the runtime options containerd writes to `-info`'s stdin: nothing, or a
// protobuf Any of any form a task's Create accepts (decodeOptions). The CRI plugin introspects
// each runtime handler this way, passing runc's Options for runtime type io.containerd.runc.v2
// and runtimeoptions.v1.Options (the handler's options table as TOML) for any other type, such
// as io.containerd.cklite.v2: refusing the latter would leave the handler without features
// (no user namespaces, no recursive read-only mounts). Nothing gives nil options.
func readInfoOptions(r io.Reader) (*options.Options, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read stdin: %w", err)
	}
	if len(data) == 0 {
		return nil, nil
	}
	var a anypb.Any
	if err := proto.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("stdin is not a protobuf Any: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return decodeOptions(&a)
}
