// Package checkpoint is cklite's record of a checkpoint, in the two places it must live.
//
// The metadata file (MetaFile) sits inside the CRIU image directory, because that directory is
// the one thing every client flow carries: ctr tars it into the checkpoint image, nerdctl
// extracts it to its checkpoint directory and re-tars it on start, the daemon hands it to the
// shim's Create. A restore reads it to find the frozen layer the rootfs must be stacked on.
//
// The lease (LeaseID) lives in containerd: it holds the checkpoint's frozen snapshot, so that
// containerd's garbage collector keeps the layer exactly as long as the checkpoint exists. Its
// labels repeat what `cklite checkpoint ls` shows, so listing needs no image directory. Removing
// the lease (cklite checkpoint rm), or its expiry (containerd.io/gc.expire, the checkpoint's
// TTL), lets the collector free every layer no container and no other checkpoint uses.
//
// The tree of checkpoints is the tree of frozen snapshots: a checkpoint's frozen layer is stacked
// on the frozen layer of the checkpoint its container was last restored from or checkpointed to,
// which the Parent field and label name.
package checkpoint

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// MetaFile is the name of the metadata file inside a CRIU image directory.
const MetaFile = "cklite.json"

// FormatVersion is the version of MetaFile's format this package writes and reads.
const FormatVersion = 1

// Contents says what a checkpoint captured.
type Contents string

const (
	MemoryAndFS Contents = "memory+fs" // CRIU dump and frozen rootfs: the default
	FSOnly      Contents = "fs"        // frozen rootfs only; the processes run on untouched
	MemoryOnly  Contents = "memory"    // CRIU dump only; a restore keeps the current rootfs
)

// ParseContents accepts the values of Contents; "" means the default, MemoryAndFS.
func ParseContents(s string) (Contents, error) {
	switch c := Contents(s); c {
	case "":
		return MemoryAndFS, nil
	case MemoryAndFS, FSOnly, MemoryOnly:
		return c, nil
	}
	return "", fmt.Errorf("checkpoint contents %q: want %q, %q or %q: %w", s, MemoryAndFS, FSOnly, MemoryOnly, errdefs.ErrInvalidArgument)
}

// HasMemory reports whether the checkpoint holds a CRIU dump.
func (c Contents) HasMemory() bool { return c != FSOnly }

// HasFS reports whether the checkpoint holds a frozen rootfs.
func (c Contents) HasFS() bool { return c != MemoryOnly }

// Meta describes one checkpoint.
type Meta struct {
	Format      int       `json:"format"`
	ID          string    `json:"id"`
	Name        string    `json:"name,omitempty"` // unique among its container's checkpoints
	Namespace   string    `json:"namespace"`
	Container   string    `json:"container"`
	Contents    Contents  `json:"contents"`
	Snapshotter string    `json:"snapshotter,omitempty"`
	Frozen      string    `json:"frozen,omitempty"` // the frozen rootfs snapshot, when Contents.HasFS
	Parent      string    `json:"parent,omitempty"` // the checkpoint whose frozen layer Frozen is stacked on
	Host        string    `json:"host"`             // machine id: frozen layers exist on this host only
	Created     time.Time `json:"created"`
	Expires     time.Time `json:"expires,omitzero"`
	MemoryBytes int64     `json:"memoryBytes"` // size of the CRIU image files
	Version     string    `json:"version"`     // the cklite that wrote it
	Dump        DumpFlags `json:"dump,omitzero"`
	// Init: the dumped PID 1 is cklite's init, whose binary a restore must mount where the dump
	// found it (shim/init.go).
	Init bool `json:"init,omitempty"`
	// InitBuild is the Go build id of that init's binary, which a restore requires of the one
	// it mounts (shim/initbuild.go).
	InitBuild string `json:"initBuild,omitempty"`
	// Lineage is the lineage of the container when it was checkpointed (see LineageKey): what a
	// container restored from this checkpoint descends from, after the checkpoint itself.
	Lineage string `json:"lineage,omitempty"`
	// Labels are the client's own (cklite checkpoint create --label).
	Labels map[string]string `json:"labels,omitempty"`
}

// DumpFlags are the CRIU options the dump was taken with. CRIU's restore needs the same ones
// (a dumped TCP connection or file lock is refused without them), and no client flow passes
// them to a restore: ctr, nerdctl and the CRI give the shim only the image directory.
type DumpFlags struct {
	OpenTCP             bool `json:"openTCP,omitempty"`
	ExternalUnixSockets bool `json:"externalUnixSockets,omitempty"`
	Terminal            bool `json:"terminal,omitempty"`
	FileLocks           bool `json:"fileLocks,omitempty"`
	// ExternalNetNS: the network namespace was left out of the dump; a restore must be given
	// one (the spec's, or a new one).
	ExternalNetNS bool `json:"externalNetNS,omitempty"`
	// NetworkLock is how CRIU locked the network for the dump, which its restore must unlock
	// the same way: "skip" (no TCP socket to protect), "nftables", or "" for CRIU's default
	// (iptables).
	NetworkLock string `json:"networkLock,omitempty"`
}

// NewID returns a fresh checkpoint id: 12 hex digits, short enough to type.
func NewID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}

// FrozenName is the snapshot name of checkpoint id's frozen rootfs.
func FrozenName(id string) string { return "cklite/checkpoint/" + id }

// Write stores m in dir, atomically: a reader sees the old file or the new one.
func Write(dir string, m Meta) error {
	m.Format = FormatVersion
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+MetaFile+".tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write checkpoint metadata: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, MetaFile)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write checkpoint metadata: %w", err)
	}
	return nil
}

// Read loads the metadata of the image directory dir. A directory without MetaFile (a stock
// runc checkpoint) is errdefs.ErrNotFound; a file that does not parse, or names no frozen layer
// where its contents say there is one, is errdefs.ErrInvalidArgument naming the file.
func Read(dir string) (Meta, error) {
	path := filepath.Join(dir, MetaFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Meta{}, fmt.Errorf("%s has no %s (not a cklite checkpoint): %w", dir, MetaFile, errdefs.ErrNotFound)
	}
	if err != nil {
		return Meta{}, fmt.Errorf("read checkpoint metadata: %w", err)
	}
	return decode(data, path)
}

// decode parses the metadata read from source (named in errors).
func decode(data []byte, source string) (Meta, error) {
	var m Meta
	if err := json.Unmarshal(data, &m); err != nil {
		return Meta{}, fmt.Errorf("checkpoint metadata %s is corrupt: %v: %w", source, err, errdefs.ErrInvalidArgument)
	}
	if err := m.validate(); err != nil {
		return Meta{}, fmt.Errorf("checkpoint metadata %s: %w", source, err)
	}
	return m, nil
}

func (m Meta) validate() error {
	var problems []string
	if m.Format != FormatVersion {
		problems = append(problems, fmt.Sprintf("format %d, this cklite reads %d", m.Format, FormatVersion))
	}
	if m.ID == "" {
		problems = append(problems, "no id")
	}
	if _, err := ParseContents(string(m.Contents)); err != nil || m.Contents == "" {
		problems = append(problems, fmt.Sprintf("contents %q", m.Contents))
	}
	if m.Contents.HasFS() && (m.Frozen == "" || m.Snapshotter == "") {
		problems = append(problems, "no frozen layer for a filesystem checkpoint")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s: %w", strings.Join(problems, "; "), errdefs.ErrInvalidArgument)
	}
	return nil
}

// MachineID identifies this host, so that a restore on another host names why the frozen layer is
// missing instead of failing on a missing snapshot.
func MachineID() string {
	for _, p := range []string{"/etc/machine-id", "/var/lib/dbus/machine-id"} {
		if b, err := os.ReadFile(p); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			return strings.TrimSpace(string(b))
		}
	}
	h, _ := os.Hostname()
	return h
}

// ImageSize sums the sizes of the regular files in dir (the CRIU images).
func ImageSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	return total, err
}
