package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"golang.org/x/sys/unix"
)

func TestLookCRIU(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := lookCRIU()
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "CRIU is not installed") {
		t.Fatalf("lookCRIU without criu in PATH: %v, want a FailedPrecondition saying CRIU is not installed", err)
	}
	// Only the lookup: an executable file of that name will do.
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "criu"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	if err := lookCRIU(); err != nil {
		t.Fatalf("lookCRIU with criu in PATH: %v", err)
	}
}

// Building options is pure: no lookup, no mount (go test ./runtime as root leaves the host as it
// found it), whatever PATH holds.
func TestCriuOpts(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for _, tc := range []struct {
		name    string
		in      CheckpointOpts
		wantErr bool
		check   func(*testing.T, CheckpointOpts)
	}{
		{name: "no image path", in: CheckpointOpts{}, wantErr: true},
		{name: "bad empty namespace", in: CheckpointOpts{ImagePath: "/i", EmptyNamespaces: []string{"pid"}}, wantErr: true},
		{name: "defaults", in: CheckpointOpts{ImagePath: "/i", Terminal: true, OpenTCP: true, CgroupsMode: "soft"}},
		{name: "exit", in: CheckpointOpts{ImagePath: "/i", Exit: true, EmptyNamespaces: []string{"network"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := tc.in.criu()
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if err != nil {
				return
			}
			if o.ImagesDirectory != tc.in.ImagePath || o.LeaveRunning == tc.in.Exit || o.ShellJob != tc.in.Terminal ||
				o.TcpEstablished != tc.in.OpenTCP || o.ManageCgroupsMode != tc.in.CgroupsMode || o.StatusFd != -1 ||
				o.EmptyNs != unix.CLONE_NEWNET {
				t.Fatalf("%+v", o)
			}
		})
	}
}
