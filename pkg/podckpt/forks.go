package podckpt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// A fork of a pod checkpoint (pkg/client's PodFork) runs on copies of the checkpoint's volumes of
// its own, kept below the namespace's checkpoints directory in pod-forks/UID/N, UID being the uid
// of the fork's pod sandbox. They belong to the fork's pod, not to the checkpoint: removing the
// checkpoint leaves them to the fork that runs on them, and they go once CRI no longer has that
// pod (pkg/client sweeps them at pod rm and checkpoint prune --orphaned).
const forksDir = "pod-forks"

// ForkDir is where the fork whose pod sandbox has uid keeps its volume copies.
func ForkDir(namespaceDir, uid string) string {
	return filepath.Join(namespaceDir, forksDir, uid)
}

// ForkUIDs lists the uids of the forks whose volume copies are kept below namespaceDir.
func ForkUIDs(namespaceDir string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(namespaceDir, forksDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pod forks' volumes: %w", err)
	}
	uids := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.IsDir() {
			uids = append(uids, e.Name())
		}
	}
	return uids, nil
}
