package runtime

import (
	"testing"

	"github.com/opencontainers/runc/libcontainer/configs"
)

func TestNameNetNS(t *testing.T) {
	for _, tc := range []struct {
		name        string
		ns          configs.Namespaces
		wantPath    string
		wantChanged bool
		wantErr     bool
		pid         int
	}{
		{name: "host network", ns: configs.Namespaces{{Type: configs.NEWPID}}, pid: 7},
		{name: "created by the spec", ns: configs.Namespaces{{Type: configs.NEWNET}}, pid: 7, wantPath: "/proc/7/ns/net", wantChanged: true},
		{name: "named by the spec", ns: configs.Namespaces{{Type: configs.NEWNET, Path: "/var/run/netns/cni-1"}}, pid: 7, wantPath: "/var/run/netns/cni-1"},
		{name: "a restore's held namespace", ns: configs.Namespaces{{Type: configs.NEWNET, Path: "/proc/1/fd/9"}}, pid: 7, wantPath: "/proc/7/ns/net", wantChanged: true},
		{name: "already named", ns: configs.Namespaces{{Type: configs.NEWNET, Path: "/proc/7/ns/net"}}, pid: 7, wantPath: "/proc/7/ns/net"},
		{name: "no init", ns: configs.Namespaces{{Type: configs.NEWNET}}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &configs.Config{Namespaces: tc.ns}
			changed, err := nameNetNS(cfg, tc.pid)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if err != nil {
				return
			}
			if got := cfg.Namespaces.PathOf(configs.NEWNET); changed != tc.wantChanged || got != tc.wantPath {
				t.Fatalf("changed %v, path %q; want %v, %q", changed, got, tc.wantChanged, tc.wantPath)
			}
		})
	}
}
