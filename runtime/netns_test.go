package runtime

import (
	"net"
	"os"
	"testing"

	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
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

func TestSocketsInUse(t *testing.T) {
	const sockstat = "sockets: used 48\nTCP: inuse 4 orphan 0 tw 18 alloc 4 mem 350\nUDP: inuse 0 mem 0\n"
	const sockstat6 = "TCP6: inuse 0\nUDP6: inuse 2\n"
	for _, tc := range []struct {
		file, proto string
		want        int
		wantErr     bool
	}{
		{file: sockstat, proto: "TCP", want: 4},
		{file: sockstat, proto: "UDP", want: 0},
		{file: sockstat6, proto: "TCP6", want: 0},
		{file: sockstat6, proto: "UDP6", want: 2},
		{file: sockstat6, proto: "TCP", wantErr: true}, // "TCP6:" is not "TCP:"
		{file: "TCP: inuse x\n", proto: "TCP", wantErr: true},
	} {
		n, err := socketsInUse(tc.file, tc.proto)
		if (err != nil) != tc.wantErr || n != tc.want {
			t.Errorf("socketsInUse(%q, %s) = %d, %v; want %d (error %v)", tc.file, tc.proto, n, err, tc.want, tc.wantErr)
		}
	}
}

// A listening socket of this process counts in its namespace.
func TestHasTCPSockets(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if has, err := HasTCPSockets(os.Getpid()); err != nil || !has {
		t.Fatalf("HasTCPSockets with a listening socket = %v, %v; want true", has, err)
	}
}

// TestNewNetNSLeavesMainThread: however the goroutines fall on threads, a new network namespace
// is never the one /proc/self/ns/net (the main thread's) names, and the main thread stays in
// its own: libcontainer takes that one for the host's.
func TestNewNetNSLeavesMainThread(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	host := inode(t, "/proc/self/ns/net")
	for i := range 200 {
		f, err := NewNetNS()
		if err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		created := st.Ino
		f.Close()
		if now := inode(t, "/proc/self/ns/net"); now != host || created == host {
			t.Fatalf("namespace %d: /proc/self/ns/net is %d, was %d; the new one is %d", i, now, host, created)
		}
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
