package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// bigSize is what a "switch" round writes before its checkpoint: past the switch rule's 1 MiB
// for a task its client paused (the Go client pauses a cklite task around a checkpoint), so the
// checkpoint freezes the upper in place (freeze.Rootfs) instead of capturing it.
const bigSize = 2 << 20

func bigContent() []byte { return bytes.Repeat([]byte("switch rule "), bigSize/12) }

// writeBig writes the round's big file into the container's rootfs.
func writeBig(t *testing.T, rootfs string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(rootfs, "big"), bigContent(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// expectChangedFiles checks that the container's rootfs holds what it held when the fault struck:
// the marks as changed after checkpoint tag, and the big file.
func expectChangedFiles(t *testing.T, rootfs, tag string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(rootfs, "big"))
	if err != nil || !bytes.Equal(data, bigContent()) {
		t.Fatalf("after the fault the rootfs's big file has %d bytes (%v), want the %d written before", len(data), err, len(bigContent()))
	}
	got, err := os.ReadFile(filepath.Join(rootfs, marksDir, "written-after-"+tag))
	if err != nil || string(got) != tag {
		t.Fatalf("after the fault the mark written after checkpoint %s reads %q (%v)", tag, got, err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, marksDir, "doomed")); !os.IsNotExist(err) {
		t.Fatalf("after the fault the mark deleted after checkpoint %s is back (%v)", tag, err)
	}
}
