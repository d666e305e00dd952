package runtime

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
)

func TestCheckNamespaces(t *testing.T) {
	self := os.Getpid()
	own := func(ty configs.NamespaceType) string { return fmt.Sprintf("/proc/%d/ns/%s", self, configs.NsName(ty)) }
	for _, tc := range []struct {
		name    string
		want    configs.Namespaces
		paths   map[configs.NamespaceType]string
		wantErr bool
	}{
		{name: "none asked", want: nil, paths: nil},
		{name: "no paths (init unknown)", want: configs.Namespaces{{Type: configs.NEWNS}}, paths: map[configs.NamespaceType]string{}, wantErr: true},
		{name: "empty path", want: configs.Namespaces{{Type: configs.NEWPID}}, paths: map[configs.NamespaceType]string{configs.NEWPID: ""}, wantErr: true},
		// A namespace given by path is joined through init, and may be the host's.
		{name: "given by path", want: configs.Namespaces{{Type: configs.NEWNET, Path: "/var/run/netns/x"}},
			paths: map[configs.NamespaceType]string{configs.NEWNET: own(configs.NEWNET)}},
		{name: "given by path, joined by path", want: configs.Namespaces{{Type: configs.NEWNET, Path: "/var/run/netns/x"}},
			paths: map[configs.NamespaceType]string{configs.NEWNET: "/var/run/netns/x"}, wantErr: true},
		{name: "another pid's", want: configs.Namespaces{{Type: configs.NEWNS}},
			paths: map[configs.NamespaceType]string{configs.NEWNS: "/proc/1/ns/mnt"}, wantErr: true},
		// The test process stands for an init that shares the host's (the shim's) namespaces.
		{name: "private namespace is the host's", want: configs.Namespaces{{Type: configs.NEWNS}},
			paths: map[configs.NamespaceType]string{configs.NEWNS: own(configs.NEWNS)}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkNamespaces(tc.want, tc.paths, self)
			if (err != nil) != tc.wantErr {
				t.Fatalf("checkNamespaces: %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !errdefs.IsFailedPrecondition(err) {
				t.Fatalf("error %v is not FailedPrecondition", err)
			}
		})
	}
}

func TestInitGuard(t *testing.T) {
	g := newInitGuard()
	if _, err := g.alive(); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("no init held: %v, want FailedPrecondition", err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if err := g.hold(pid); err != nil {
		t.Fatal(err)
	}
	defer g.drop()
	st := &libcontainer.State{BaseState: libcontainer.BaseState{InitProcessPid: pid}}
	if err := g.verify(st); err != nil {
		t.Fatalf("live init without namespaces of its own: %v", err)
	}
	st.InitProcessPid = pid + 1
	if err := g.verify(st); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("state naming another pid: %v, want FailedPrecondition", err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait() // reaped: the pid may now be reused, the pidfd still names the dead one
	if _, err := g.alive(); !errdefs.IsNotFound(err) {
		t.Fatalf("exited init: %v, want NotFound", err)
	}
	g.drop()
	if _, err := g.alive(); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("dropped: %v, want FailedPrecondition", err)
	}
}
