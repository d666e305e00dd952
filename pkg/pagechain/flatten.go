package pagechain

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cklite/cklite/pkg/criuimage"
)

// Flatten returns an image directory with dir's images that needs no parent: dir itself when it
// has none, else a copy made below tmpRoot in which every page is present. done removes the copy
// and releases the chain; the caller calls it once it has read the directory.
func Flatten(dir, tmpRoot string) (flat string, done func(), err error) {
	l, err := ReadLock(dir)
	if err != nil {
		return "", nil, err
	}
	if len(l.Dirs) == 1 {
		return dir, l.Unlock, nil
	}
	defer l.Unlock()
	tmp, err := os.MkdirTemp(tmpRoot, ".cklite-flat-")
	if err != nil {
		return "", nil, err
	}
	if err := flattenInto(l.Dirs, tmp); err != nil {
		os.RemoveAll(tmp)
		return "", nil, fmt.Errorf("flatten image directory %s: %w", dir, err)
	}
	return tmp, func() { os.RemoveAll(tmp) }, nil
}

// flattenInto writes the images of dirs[0] into out: each process's pages file whole, with the
// pages of the chain copied in, and every other file as it is.
func flattenInto(dirs []string, out string) error {
	dir := dirs[0]
	pids, err := criuimage.PagemapPids(dir)
	if err != nil {
		return err
	}
	rewritten := map[string]bool{}
	for _, pid := range pids {
		names, err := flattenProcess(dirs, pid, out)
		if err != nil {
			return err
		}
		for _, n := range names {
			rewritten[n] = true
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		// The report describes the deduplicated directory, not the copy.
		if rewritten[n] || !e.Type().IsRegular() || strings.HasPrefix(n, ".") || n == ReportFile {
			continue
		}
		if err := copyFile(filepath.Join(dir, n), filepath.Join(out, n)); err != nil {
			return err
		}
	}
	return nil
}

// flattenProcess writes process pid's pagemap and pages file into out when it has pages in a
// parent, and returns their names.
func flattenProcess(dirs []string, pid uint32, out string) ([]string, error) {
	src, err := openSource(dirs, pid)
	if err != nil {
		return nil, err
	}
	defer src.close()
	if len(src.levels) == 0 || !hasInParent(src.levels[0].pm.Runs) {
		return nil, nil
	}
	pm := src.levels[0].pm
	f, err := os.Create(filepath.Join(out, pm.PagesName()))
	if err != nil {
		return nil, err
	}
	runs, _, err := rewriteFile(src, flatten, f, false)
	if err != nil {
		return nil, err
	}
	pm.Runs = runs
	name := criuimage.PagemapName(pid)
	if err := os.WriteFile(filepath.Join(out, name), pm.Encode(), 0o600); err != nil {
		return nil, err
	}
	return []string{name, pm.PagesName()}, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}
