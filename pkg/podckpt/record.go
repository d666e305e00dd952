package podckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// RecordFile is the record's name in a pod checkpoint's directory.
const RecordFile = "pod.json"

// FormatVersion is the version of RecordFile's format this package writes and reads.
const FormatVersion = 1

// LabelPod is the checkpoint label (checkpoint.LabelUserPrefix + it on the lease) that ties a
// member checkpoint to its pod checkpoint's id.
const LabelPod = "pod-checkpoint"

// dirPrefix starts the name of a pod checkpoint's directory in its namespace's checkpoints
// directory, where the containers' image directories are CONTAINER-TIME.
const dirPrefix = "pod-"

// Record is one pod checkpoint.
type Record struct {
	Format    int    `json:"format"`
	ID        string `json:"id"`
	Namespace string `json:"namespace"` // containerd's (CRI's k8s.io)
	// Sandbox is the CRI pod sandbox checkpointed; Pod its NAMESPACE/NAME as CRI's metadata
	// says (the kubelet's pod).
	Sandbox string    `json:"sandbox"`
	Pod     string    `json:"pod"`
	Handler string    `json:"handler"` // the sandbox's runtime handler
	Created time.Time `json:"created"`
	// FrozenMs is how long the pod was frozen: from the first container's freeze to the last
	// one's thaw.
	FrozenMs int64 `json:"frozenMs"`
	// SandboxConfig is the sandbox's CRI PodSandboxConfig as containerd's CRI reports it
	// (PodSandboxStatus, verbose), what a fork runs a new sandbox with.
	SandboxConfig json.RawMessage `json:"sandboxConfig"`
	Members       []Member        `json:"members"`
	Volumes       []Volume        `json:"volumes,omitempty"`
	// Dir is the record's directory (not stored: where it was read from).
	Dir string `json:"-"`
}

// Member is one container of the pod and its checkpoint.
type Member struct {
	Name       string `json:"name"` // the CRI container name (the kubelet's container)
	Container  string `json:"container"`
	Checkpoint string `json:"checkpoint"`
	// Config is the container's CRI ContainerConfig as containerd's CRI reports it
	// (ContainerStatus, verbose), what a fork creates its container with.
	Config json.RawMessage `json:"config"`
	// Image and Spec are the container's image and runtime spec in containerd, what its
	// checkpoint image is made of once the container is gone (client.ExportOptions).
	Image string          `json:"image"`
	Spec  json.RawMessage `json:"spec"`
}

// Volume is one of the pod's volumes copied at the checkpoint.
type Volume struct {
	HostPath string `json:"hostPath"` // the directory the containers mount
	Copy     string `json:"copy"`     // its copy, relative to the record's directory
	Stats
}

// Dir is the directory of pod checkpoint id below a namespace's checkpoints directory.
func Dir(namespaceDir, id string) string { return filepath.Join(namespaceDir, dirPrefix+id) }

// MemberDir is where member name's CRIU images go in the record's directory.
func (r Record) MemberDir(name string) string { return filepath.Join(r.Dir, "containers", name) }

// CopyDir is the absolute path of volume v's copy.
func (r Record) CopyDir(v Volume) string { return filepath.Join(r.Dir, v.Copy) }

// Checkpoints are the members' checkpoint ids.
func (r Record) Checkpoints() []string {
	ids := make([]string, 0, len(r.Members))
	for _, m := range r.Members {
		ids = append(ids, m.Checkpoint)
	}
	return ids
}

// Write writes r into its directory, atomically: a record that is there is whole.
func Write(r Record) error {
	r.Format = FormatVersion
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(r.Dir, RecordFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write pod checkpoint record: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(r.Dir, RecordFile)); err != nil {
		return fmt.Errorf("write pod checkpoint record: %w", err)
	}
	return nil
}

// Read reads the record in dir.
func Read(dir string) (Record, error) {
	b, err := os.ReadFile(filepath.Join(dir, RecordFile))
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, fmt.Errorf("no pod checkpoint in %s: %w", dir, errdefs.ErrNotFound)
	}
	if err != nil {
		return Record{}, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("pod checkpoint record %s: %w", dir, err)
	}
	if r.Format != FormatVersion {
		return Record{}, fmt.Errorf("pod checkpoint record %s: format %d, this cklite reads %d: %w", dir, r.Format, FormatVersion, errdefs.ErrNotImplemented)
	}
	r.Dir = dir
	return r, nil
}

// List reads the pod checkpoints below a namespace's checkpoints directory, oldest first. A
// directory without a whole record (a checkpoint that failed midway, or one being taken) is not
// one.
func List(namespaceDir string) ([]Record, error) {
	entries, err := os.ReadDir(namespaceDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pod checkpoints: %w", err)
	}
	var out []Record
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		r, err := Read(filepath.Join(namespaceDir, e.Name()))
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Record) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// Lookup finds the pod checkpoint ref names among records: its id or a unique id prefix.
func Lookup(records []Record, ref string) (Record, error) {
	var found []Record
	for _, r := range records {
		if r.ID == ref {
			return r, nil
		}
		if ref != "" && strings.HasPrefix(r.ID, ref) {
			found = append(found, r)
		}
	}
	switch len(found) {
	case 0:
		return Record{}, fmt.Errorf("no pod checkpoint %q: %w", ref, errdefs.ErrNotFound)
	case 1:
		return found[0], nil
	}
	return Record{}, fmt.Errorf("pod checkpoint %q is ambiguous (%d match): %w", ref, len(found), errdefs.ErrInvalidArgument)
}
