package shim

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/containerd/errdefs"
)

// checkImageDir refuses a client-named image directory that already holds files. CRIU writes
// its images over whatever is there: a second checkpoint into the directory of a first one
// replaced the first's cklite.json (both stayed listed, the first no longer restorable) and
// left the first dump's extra page images next to the second's, which the image check then
// counted ("pages-3.img is missing", issue 16 item 5). A new or empty directory is taken as is.
func checkImageDir(dir string) error {
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checkpoint image directory %s: %w", dir, err)
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if len(names) == 0 {
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("checkpoint image directory %s: %w", dir, err)
		}
		return nil
	}
	return fmt.Errorf("checkpoint image directory %s is not empty (it holds %s, maybe an earlier checkpoint): give each checkpoint a new or empty directory: %w",
		dir, names[0], errdefs.ErrAlreadyExists)
}
