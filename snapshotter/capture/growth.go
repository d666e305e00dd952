package capture

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// fsUse is what the filesystem of an upper has in use: bytes of its blocks, and inodes.
type fsUse struct {
	Bytes, Inodes int64
}

func statUse(dir string) (fsUse, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fsUse{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return fsUse{Bytes: int64(st.Blocks-st.Bfree) * st.Bsize, Inodes: int64(st.Files - st.Ffree)}, nil
}

// Growth is how much the upper's filesystem grew since the previous capture was written: what the
// upper can have gained, at most, in new blocks and new entries (every writer of the
// filesystem counts, so it never says too little of new data). It cannot see a file rewritten in
// place, which takes no new blocks.
type Growth struct {
	Bytes int64 // new bytes in use
	New   int64 // new entries (inodes in use)
	// Entries and Size are the upper's entries and bytes of regular files at most (the previous
	// capture's, plus the growth), but for files rewritten larger in place.
	Entries, Size int64
}

// Growth tells how much the upper grew since the previous capture (Open's record); ok is false
// without one, or without its filesystem's use then.
func (c *Capture) Growth() (g Growth, ok bool, err error) {
	if c.prev == nil || c.prev.use == (fsUse{}) {
		return Growth{}, false, nil
	}
	now, err := statUse(c.upper)
	if err != nil {
		return Growth{}, false, err
	}
	g.Bytes = max(now.Bytes-c.prev.use.Bytes, 0)
	g.New = max(now.Inodes-c.prev.use.Inodes, 0)
	g.Entries = int64(c.prev.Len()) + g.New
	g.Size = c.prev.Size + g.Bytes
	return g, true, nil
}
