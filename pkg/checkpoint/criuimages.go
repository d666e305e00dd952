package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
)

// CheckImages verifies that dir holds a CRIU image set whose memory is complete, before a
// restore spends a container on it: CRIU itself reports a missing page file only as a failed
// read ("Can't read async pr bytes"), which names no file.
//
// Every dumped process and shared memory segment has a pagemap-*.img, and the pages it maps
// are in pages-<n>.img, n counting from 1 across the dump.
func CheckImages(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "inventory.img")); err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("%s is not a CRIU image directory (no inventory.img): %w", dir, errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("checkpoint image directory: %w", err)
	}
	pagemaps, err := filepath.Glob(filepath.Join(dir, "pagemap-*.img"))
	if err != nil {
		return err
	}
	for n := 1; n <= len(pagemaps); n++ {
		name := fmt.Sprintf("pages-%d.img", n)
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			if os.IsNotExist(err) {
				return fmt.Errorf("checkpoint image directory %s is incomplete: %s is missing (%d memory maps): %w",
					dir, name, len(pagemaps), errdefs.ErrInvalidArgument)
			}
			return fmt.Errorf("checkpoint image directory: %w", err)
		}
	}
	return nil
}
