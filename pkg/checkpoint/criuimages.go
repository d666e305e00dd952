package checkpoint

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/errdefs"

	"github.com/cklite/cklite/pkg/criuimage"
)

// CheckImages verifies that dir holds a CRIU image set whose memory is complete, before a
// restore spends a container on it: CRIU itself reports a missing page file only as a failed
// read ("Can't read async pr bytes"), which names no file.
//
// Every dumped process and shared memory segment has a pagemap-*.img, and the pages it maps
// are in the pages file its head names: pages-<n>.img, n counting from 1 across the dump as CRIU
// writes them, a new n where cklite stored the memory as what changed since a parent's.
// A pages file cklite compressed (criuimage.CompressedSuffix) counts as there.
func CheckImages(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "inventory.img")); err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("%s is not a CRIU image directory (no inventory.img): %w", dir, errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("checkpoint image directory: %w", err)
	}
	files, err := criuimage.PagesFiles(dir)
	if err != nil {
		return fmt.Errorf("checkpoint image directory %s: %w: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if _, err := criuimage.PagesSize(dir, name); err != nil {
			if os.IsNotExist(err) {
				return fmt.Errorf("checkpoint image directory %s is incomplete: %s is missing (named by %s): %w",
					dir, name, files[name], errdefs.ErrInvalidArgument)
			}
			return fmt.Errorf("checkpoint image directory: %w", err)
		}
	}
	return nil
}
