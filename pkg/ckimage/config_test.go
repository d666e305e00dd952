package ckimage

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// TestReadConfig: a config blob over MaxConfigSize is refused, naming its size and the limit,
// whether its descriptor says so or understates it.
func TestReadConfig(t *testing.T) {
	ctx := context.Background()
	cs, err := local.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := func(data []byte) ocispec.Descriptor {
		desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(data), Size: int64(len(data))}
		if err := content.WriteBlob(ctx, cs, desc.Digest.String(), bytes.NewReader(data), desc); err != nil {
			t.Fatal(err)
		}
		return desc
	}
	small := []byte(`{"config":{"Entrypoint":["/.cklite-restore"]}}`)
	huge := bytes.Repeat([]byte(" "), MaxConfigSize+1)
	understated := store(huge)
	understated.Size = int64(len(small))
	for _, tc := range []struct {
		name    string
		desc    ocispec.Descriptor
		wantErr string // "" for small's contents
	}{
		{"small", store(small), ""},
		{"at the limit", store(bytes.Repeat([]byte(" "), MaxConfigSize)), ""},
		{"over the limit", store(huge), "is 1048577 bytes, more than the 1048576"},
		{"declared over the limit, not stored", ocispec.Descriptor{Digest: digest.FromString("x"), Size: 1 << 40}, "is 1099511627776 bytes"},
		{"understated by its descriptor", understated, "is 1048577 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := readConfig(ctx, cs, tc.desc)
			if tc.wantErr == "" {
				if err != nil || int64(len(data)) != tc.desc.Size {
					t.Fatalf("read %d bytes, %v; want %d", len(data), err, tc.desc.Size)
				}
				return
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want invalid argument naming %q", err, tc.wantErr)
			}
		})
	}
}
