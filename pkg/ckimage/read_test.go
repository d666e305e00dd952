package ckimage

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestPruneCache(t *testing.T) {
	cache := t.TempDir()
	old, fresh := filepath.Join(cache, "old"), filepath.Join(cache, "fresh")
	for _, d := range []string{old, fresh} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	if err := PruneCache(cache, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("an entry unused for 2h is still there (%v)", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh entry was pruned: %v", err)
	}
	if err := PruneCache(filepath.Join(cache, "none"), time.Hour); err != nil {
		t.Errorf("pruning a missing cache: %v", err)
	}
}

func TestCheckMounts(t *testing.T) {
	cri := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/proc", Type: "proc"},
		{Destination: "/etc/hosts", Type: "bind", Options: []string{"rbind", "ro"}},
		{Destination: "/dev/shm", Source: "/run/shm", Options: []string{"rbind"}},
		{Destination: "/etc/hosts/", Type: "bind"},
	}}
	if got, want := BindMounts(cri), []string{"/dev/shm", "/etc/hosts"}; !slices.Equal(got, want) {
		t.Fatalf("BindMounts: %q, want %q", got, want)
	}
	plain := &specs.Spec{Mounts: []specs.Mount{{Destination: "/proc", Type: "proc"}, {Destination: "/dev/shm", Type: "tmpfs"}}}
	for _, tc := range []struct {
		name        string
		label       string // "": none
		spec        *specs.Spec
		wantMissing string
	}{
		{name: "unrecorded", spec: plain},
		{name: "none dumped", label: `[]`, spec: cri},
		{name: "same", label: `["/dev/shm","/etc/hosts"]`, spec: cri},
		{name: "extra in the container", label: `["/etc/hosts"]`, spec: cri},
		{name: "missing", label: `["/dev/shm","/etc/hosts"]`, spec: plain, wantMissing: "/dev/shm, /etc/hosts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Checkpoint{Config: ocispec.ImageConfig{Labels: map[string]string{LabelCheckpoint: "abc"}}}
			if tc.label != "" {
				c.Config.Labels[LabelBindMounts] = tc.label
			}
			err := c.CheckMounts(tc.spec)
			switch {
			case tc.wantMissing == "" && err != nil:
				t.Fatalf("CheckMounts: %v", err)
			case tc.wantMissing != "" && (err == nil || !strings.Contains(err.Error(), "bind mounts at "+tc.wantMissing+",") || !errdefs.IsFailedPrecondition(err)):
				t.Fatalf("CheckMounts: %v, want FailedPrecondition naming %s", err, tc.wantMissing)
			}
		})
	}
}
