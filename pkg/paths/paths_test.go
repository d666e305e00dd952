package paths

import (
	"context"
	"errors"
	"strings"
	"testing"

	api "github.com/containerd/containerd/api/services/introspection/v1"
	"github.com/containerd/containerd/v2/core/introspection"
)

const id = "0f8b4a42-3d47-4c5e-9d3a-6f1c2b7e9a10"

func TestNewInstance(t *testing.T) {
	for _, tc := range []struct {
		name, stateDir, uuid string
		wantDir, wantErr     string
	}{
		{name: "default state dir", stateDir: DefaultStateDir, uuid: id, wantDir: "/var/lib/cklite/containerd/" + id},
		{name: "private state dir", stateDir: "/srv/ck/lib/cklite/", uuid: id, wantDir: "/srv/ck/lib/cklite/containerd/" + id},
		{name: "not a uuid", stateDir: DefaultStateDir, uuid: "../../etc", wantErr: "is not one"},
		{name: "empty uuid", stateDir: DefaultStateDir, uuid: "", wantErr: "is not one"},
		{name: "uuid spelled otherwise", stateDir: DefaultStateDir, uuid: "{" + id + "}", wantErr: "is not one"},
		{name: "relative state dir", stateDir: "var/lib/cklite", uuid: id, wantErr: "absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i, err := NewInstance(tc.stateDir, tc.uuid)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("NewInstance = %+v, %v; want an error naming %q", i, err, tc.wantErr)
				}
				return
			}
			if err != nil || i.Dir != tc.wantDir || i.UUID != tc.uuid {
				t.Fatalf("NewInstance = %+v, %v; want dir %s", i, err, tc.wantDir)
			}
		})
	}
}

func TestInstancePaths(t *testing.T) {
	i, err := NewInstance("/s", id)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := i.ImageCache(), "/s/containerd/"+id+"/images"; got != want {
		t.Errorf("ImageCache = %s, want %s", got, want)
	}
	if got, want := i.Checkpoints(), "/s/containerd/"+id+"/checkpoints"; got != want {
		t.Errorf("Checkpoints = %s, want %s", got, want)
	}
	if got, err := i.NamespaceCheckpoints("k8s.io"); err != nil || got != i.Checkpoints()+"/k8s.io" {
		t.Errorf("NamespaceCheckpoints(k8s.io) = %s, %v", got, err)
	}
	for _, ns := range []string{"", "..", "a/b"} {
		if got, err := i.NamespaceCheckpoints(ns); err == nil {
			t.Errorf("NamespaceCheckpoints(%q) = %s, want an error", ns, got)
		}
	}
}

// server answers introspection's Server call; the other calls are not used.
type server struct {
	introspection.Service
	uuid string
	err  error
}

func (s server) Server(context.Context) (*api.ServerResponse, error) {
	return &api.ServerResponse{UUID: s.uuid}, s.err
}

func TestForContainerd(t *testing.T) {
	i, err := ForContainerd(context.Background(), "/s", server{uuid: id})
	if err != nil || i.Dir != "/s/containerd/"+id {
		t.Fatalf("ForContainerd = %+v, %v", i, err)
	}
	down := errors.New("connection refused")
	if _, err := ForContainerd(context.Background(), "/s", server{err: down}); !errors.Is(err, down) || !strings.Contains(err.Error(), "UUID") {
		t.Fatalf("ForContainerd with containerd down = %v, want the cause wrapped and named", err)
	}
}
