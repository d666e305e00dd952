// Package criuimage reads the parts of a CRIU (4.x) image directory that decide what a restore
// would run and with which privileges, and admits or refuses the directory against the OCI spec
// of the container it is to be restored into, before CRIU runs and before the old task is touched.
//
// A checkpoint image from elsewhere (an imported or pulled image, another container's directory)
// is code and privileges, not data: CRIU restores the credentials, capabilities, seccomp mode,
// namespaces and mounts its images describe. So the images are decoded here, with protowire and
// field numbers from CRIU's images/*.proto, rather than trusted: no generated code, no CRIU.
// Only the messages and fields the checks need are decoded; unknown fields are skipped, as
// protobuf readers do.
package criuimage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"google.golang.org/protobuf/encoding/protowire"
)

// Magic numbers (CRIU's criu/include/magic.h): most images start with the image-set magic, then
// their own.
const (
	magicCommon    = 0x54564319
	magicService   = 0x55105940
	magicInventory = 0x58313116
	magicPstree    = 0x50273030
	magicCore      = 0x55053847
	magicPagemap   = 0x56084025
	magicMnts      = 0x55563928
	magicIDs       = 0x54432030
)

// maxImage bounds what is read of one (non-pages) image: these hold a few entries per process
// or mount; a larger one is not an image CRIU wrote for a container.
const maxImage = 64 << 20

// readImage returns the entries of the CRIU image at path, checking its magic.
func readImage(path string, magic uint32) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxImage+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxImage {
		return nil, fmt.Errorf("%s: larger than %d MiB", path, maxImage>>20)
	}
	return splitImage(path, b, magic)
}

func splitImage(path string, b []byte, magic uint32) ([][]byte, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%s: too short for a CRIU image", path)
	}
	m := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if m == magicCommon || m == magicService {
		if len(b) < 4 {
			return nil, fmt.Errorf("%s: too short for a CRIU image", path)
		}
		m = binary.LittleEndian.Uint32(b)
		b = b[4:]
	}
	if m != magic {
		return nil, fmt.Errorf("%s: magic %#x, want %#x", path, m, magic)
	}
	var entries [][]byte
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, fmt.Errorf("%s: truncated entry size", path)
		}
		n := binary.LittleEndian.Uint32(b)
		b = b[4:]
		if uint64(n) > uint64(len(b)) {
			return nil, fmt.Errorf("%s: entry of %d bytes, %d left: truncated", path, n, len(b))
		}
		entries = append(entries, b[:n])
		b = b[n:]
	}
	return entries, nil
}

// field is one decoded protobuf field: a varint, or the bytes of a length-delimited one.
type field struct {
	num   protowire.Number
	v     uint64
	bytes []byte
}

// fields decodes the top-level fields of a message. Packed repeated varints come back as one
// bytes field: use varints to read them.
func fields(b []byte) ([]field, error) {
	var out []field
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		f := field{num: num}
		switch typ {
		case protowire.VarintType:
			f.v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			f.bytes, n = protowire.ConsumeBytes(b)
		case protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(b)
			f.v = uint64(v)
		case protowire.Fixed64Type:
			f.v, n = protowire.ConsumeFixed64(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		out = append(out, f)
	}
	return out, nil
}

// varints reads a repeated varint field that may be packed (bytes) or not (one field each).
func varints(f field) ([]uint64, error) {
	if f.bytes == nil {
		return []uint64{f.v}, nil
	}
	var out []uint64
	for b := f.bytes; len(b) > 0; {
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		out = append(out, v)
		b = b[n:]
	}
	return out, nil
}

var errMissing = errors.New("required field missing")
