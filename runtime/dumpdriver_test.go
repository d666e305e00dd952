package runtime

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	criurpc "github.com/checkpoint-restore/go-criu/v7/rpc"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/devices"
	"google.golang.org/protobuf/proto"
)

// fakeCRIUEnv names the file into which this test binary, run as "criu swrk 3", writes the
// request it receives; it answers it with success.
const fakeCRIUEnv = "CKLITE_TEST_CRIU_REQUEST"

// fakeCRIU is the test binary as CRIU's service: one request, recorded, answered.
func fakeCRIU(out string) int {
	sk := os.NewFile(3, "criu-server")
	buf := make([]byte, 1<<16)
	n, err := sk.Read(buf)
	if err != nil {
		println(err.Error())
		return 1
	}
	if err := os.WriteFile(out, buf[:n], 0o600); err != nil {
		println(err.Error())
		return 1
	}
	var req criurpc.CriuReq
	if err := proto.Unmarshal(buf[:n], &req); err != nil {
		println(err.Error())
		return 1
	}
	resp, _ := proto.Marshal(&criurpc.CriuResp{Type: req.Type, Success: proto.Bool(true)})
	if _, err := sk.Write(resp); err != nil {
		println(err.Error())
		return 1
	}
	return 0
}

// TestDumpRequestMatchesLibcontainer: for the same container and options the driver sends CRIU
// libcontainer's Checkpoint's request, but for the descriptor numbers of the directories and
// the notifications, and writes the same descriptors.json. The container is libcontainer's
// state of this test process as its init (its root is the host's: masked paths exist or not).
func TestDumpRequestMatchesLibcontainer(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/real", filepath.Join(rootfs, "link")); err != nil {
		t.Fatal(err)
	}
	null, err := devices.DeviceFromPath("/dev/null", "rwm")
	if err != nil {
		t.Fatal(err)
	}
	mounts := []*configs.Mount{
		{Device: "bind", Source: "/etc/hosts", Destination: "/etc/hosts"},
		{Device: "bind", Source: "/tmp", Destination: "/link/data"}, // key resolved in the rootfs
		{Device: "cgroup", Source: "cgroup", Destination: "/sys/fs/cgroup"},
		{Device: "tmpfs", Source: "tmpfs", Destination: "/dev"},
	}
	masks := []string{"/etc/passwd", "/proc/acpi", "/proc/no-such-file"} // a file, a directory, none
	for _, tc := range []struct {
		name   string
		ns     configs.Namespaces
		labels []string
		opts   libcontainer.CriuOpts
	}{
		{
			name:   "leave running, own namespaces, default configuration file",
			ns:     configs.Namespaces{{Type: configs.NEWNS}, {Type: configs.NEWPID}, {Type: configs.NEWNET}},
			labels: []string{"bundle=/x"},
			opts:   libcontainer.CriuOpts{LeaveRunning: true, EmptyNs: 0x40000000, ManageCgroupsMode: "soft"},
		},
		{
			name:   "exit, joined network and PID namespaces, named configuration file",
			ns:     configs.Namespaces{{Type: configs.NEWNS}, {Type: configs.NEWPID, Path: "/proc/self/ns/pid"}, {Type: configs.NEWNET, Path: "/proc/self/ns/net"}},
			labels: []string{criuConfigLabel + "=/run/x/cklite-criu.conf"},
			opts:   libcontainer.CriuOpts{TcpEstablished: true, ExternalUnixConnections: true, ShellJob: true, FileLocks: true},
		},
		{
			name:   "cgroup namespace, no configuration file",
			ns:     configs.Namespaces{{Type: configs.NEWNS}, {Type: configs.NEWCGROUP}},
			labels: []string{criuConfigLabel + "="},
			opts:   libcontainer.CriuOpts{LeaveRunning: true, ManageCgroupsMode: "ignore"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configs.Config{
				Rootfs: rootfs, Mounts: mounts, MaskPaths: masks, Namespaces: tc.ns, Labels: tc.labels,
				Devices: []*devices.Device{null},
				Cgroups: &configs.Cgroup{Path: "/cklite-test-none", Resources: &cgroups.Resources{}},
			}
			lc := loadFakeContainer(t, cfg)
			got := fakeDump(t, func(o *libcontainer.CriuOpts) error {
				c := &Container{lc: lc, guard: newInitGuard()}
				defer c.ready.end()
				return c.driveDump(o)
			}, tc.opts)
			want := fakeDump(t, lc.Checkpoint, tc.opts)
			for _, r := range []*criurpc.CriuReq{got.req, want.req} {
				r.Opts.ImagesDirFd, r.Opts.WorkDirFd, r.Opts.NotifyScripts = nil, nil, nil
			}
			if !proto.Equal(got.req, want.req) {
				t.Errorf("driver's request:\n%v\nlibcontainer's:\n%v", got.req, want.req)
			}
			if got.descriptors != want.descriptors {
				t.Errorf("descriptors.json: driver's %s, libcontainer's %s", got.descriptors, want.descriptors)
			}
		})
	}
}

// loadFakeContainer is libcontainer's container of state cfg, this process as its init.
func loadFakeContainer(t *testing.T, cfg configs.Config) *libcontainer.Container {
	root := t.TempDir()
	st := libcontainer.State{
		BaseState:           libcontainer.BaseState{ID: "c", InitProcessPid: os.Getpid(), Config: cfg},
		CgroupPaths:         map[string]string{"": "/sys/fs/cgroup/cklite-test-none", "freezer": "/sys/fs/cgroup/freezer/cklite-test-none"},
		ExternalDescriptors: []string{"/dev/null", "pipe:[1]", "pipe:[2]"},
	}
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "c"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "c", "state.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	lc, err := libcontainer.Load(root, "c")
	if err != nil {
		t.Fatal(err)
	}
	knownCRIUVersion.Store(40201)
	giveCRIUVersion(lc)
	return lc
}

// fakeDumped is what a dump through the fake CRIU sent and wrote.
type fakeDumped struct {
	req         *criurpc.CriuReq
	descriptors string
}

// useFakeCRIU makes this test binary the "criu" of the test (fakeCRIU), which records its
// request into the returned directory.
func useFakeCRIU(t *testing.T) string {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(dir, "criu")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv(fakeCRIUEnv, filepath.Join(dir, "request"))
	return dir
}

// fakeDump runs dump with o (into fresh directories) against the fake CRIU.
func fakeDump(t *testing.T, dump func(*libcontainer.CriuOpts) error, o libcontainer.CriuOpts) fakeDumped {
	dir := useFakeCRIU(t)
	o.ImagesDirectory, o.WorkDirectory, o.StatusFd = filepath.Join(dir, "images"), filepath.Join(dir, "work"), -1
	if err := dump(&o); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "request"))
	if err != nil {
		t.Fatal(err)
	}
	var req criurpc.CriuReq
	if err := proto.Unmarshal(data, &req); err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadFile(filepath.Join(o.ImagesDirectory, "descriptors.json"))
	if err != nil {
		t.Fatal(err)
	}
	return fakeDumped{req: &req, descriptors: string(fds)}
}
