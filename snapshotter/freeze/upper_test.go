package freeze

import (
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
)

func TestUpperDir(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mounts []mount.Mount
		want   string
	}{
		{name: "overlay", mounts: []mount.Mount{{Type: "overlay", Options: []string{"index=off", "workdir=/s/2/work", "upperdir=/s/2/fs", "lowerdir=/s/1/fs"}}}, want: "/s/2/fs"},
		{name: "no parent", mounts: []mount.Mount{{Type: "bind", Source: "/s/1/fs", Options: []string{"rbind", "rw"}}}, want: "/s/1/fs"},
		{name: "overlay without upper", mounts: []mount.Mount{{Type: "overlay", Options: []string{"lowerdir=/a:/b"}}}},
		{name: "not overlay", mounts: []mount.Mount{{Type: "btrfs", Source: "/dev/x"}}},
		{name: "several mounts", mounts: []mount.Mount{{Type: "bind", Source: "/a"}, {Type: "bind", Source: "/b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := UpperDir("k", tc.mounts)
			if tc.want == "" {
				if !errdefs.IsNotImplemented(err) {
					t.Fatalf("UpperDir = %q, %v; want a NotImplemented error", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("UpperDir = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
