package pagechain

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// removingMark is the file Remove leaves in a directory it is about to remove: no new child
// deduplicates against it from then on.
const removingMark = ".removing"

// ErrParentRemoved is returned by Dedup when the parent is being removed.
var ErrParentRemoved = errors.New("parent image directory being removed")

// Remove removes the image directory dir, first detaching the image directories beside it (in
// the same directory: cklite deduplicates only against a sibling) that read pages from it, so that
// each stays restorable. It returns the directories it detached.
func Remove(dir string) ([]string, error) {
	f, err := lockDir(dir, unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	// Every Dedup that took dir as parent has finished (it held dir shared); one that comes
	// after the mark finds it.
	err = writeFileSync(filepath.Join(dir, removingMark), nil)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("mark image directory %s removed: %w", dir, err)
	}
	children, err := Children(dir)
	if err != nil {
		return nil, err
	}
	for _, c := range children {
		if _, err := Detach(c); err != nil {
			return nil, fmt.Errorf("detach image directory %s from %s: %w", c, dir, err)
		}
	}
	// A restore reading dir (shared) finishes before it goes.
	if f, err = lockDir(dir, unix.LOCK_EX); err != nil {
		return nil, err
	}
	defer f.Close()
	return children, os.RemoveAll(dir)
}

// Children are the image directories beside dir whose parent link names dir.
func Children(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Dir(abs))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		sib := filepath.Join(filepath.Dir(abs), e.Name())
		if p, err := parentOf(sib); err == nil && p == abs {
			out = append(out, sib)
		}
	}
	return out, nil
}

// removing reports whether Remove has marked dir.
func removing(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, removingMark))
	return err == nil
}
