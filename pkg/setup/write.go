package setup

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Written says what Write did with each file.
type Written struct {
	Path    string
	Changed bool // false: it held this content already
}

// Write writes files and makes the directories the instance at root runs in. It is idempotent: a
// file that holds its content already is left alone. A file that holds something else (edited by
// hand, or written for other options) is kept and the whole write refused, naming it, unless
// force is set; nothing is written then.
func Write(root string, files []File, force bool) ([]Written, error) {
	var conflicts []string
	for _, f := range files {
		old, err := os.ReadFile(f.Path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, err
		case !bytes.Equal(old, []byte(f.Content)):
			conflicts = append(conflicts, f.Path)
		}
	}
	if len(conflicts) > 0 && !force {
		return nil, fmt.Errorf("%s already exist(s) with other content: --force to replace, or another root", strings.Join(conflicts, ", "))
	}
	l := Layout{root}
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{
		// 0711: a user namespace's root reaches container files below, as below /var/lib.
		{root, 0o711}, {l.path("run"), 0o711}, {l.path("lib"), 0o711},
		{l.path("etc"), 0o755}, {l.CNIConfDir(), 0o755}, {l.path("log"), 0o700}, {l.Temp(), 0o711},
	} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return nil, err
		}
	}
	var done []Written
	for _, f := range files {
		old, err := os.ReadFile(f.Path)
		if err == nil && bytes.Equal(old, []byte(f.Content)) {
			done = append(done, Written{Path: f.Path})
			continue
		}
		if err := writeFile(f); err != nil {
			return done, err
		}
		done = append(done, Written{Path: f.Path, Changed: true})
	}
	return done, nil
}

// writeFile replaces f.Path by a complete file at once: a daemon never reads half of one.
func writeFile(f File) error {
	if err := os.MkdirAll(filepath.Dir(f.Path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.Path), "."+filepath.Base(f.Path)+".")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(f.Content); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(fs.FileMode(f.Mode)); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), f.Path)
}
