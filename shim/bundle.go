package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
)

// Files the shim keeps in the bundle for `containerd-shim-cklite-v2 delete`, which runs as a
// fresh process after the serving shim died and has nothing but the bundle to go on.
const (
	optionsFile    = "options.json"
	exitStatusFile = "exit.json"
)

func writeOptions(bundle string, o *options.Options) error {
	data, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("marshal options: %w", err)
	}
	return writeAtomic(filepath.Join(bundle, optionsFile), data)
}

// readOptions returns empty options when the file is missing (the shim died before writing).
func readOptions(bundle string) (*options.Options, error) {
	var o options.Options
	data, err := os.ReadFile(filepath.Join(bundle, optionsFile))
	if errors.Is(err, os.ErrNotExist) {
		return &o, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &o); err != nil {
		return nil, fmt.Errorf("parse %s: %w", optionsFile, err)
	}
	return &o, nil
}

// exitRecord is the init process's exit, as reported by Stop.
type exitRecord struct {
	Pid       int       `json:"pid"`
	Status    int       `json:"status"`
	Timestamp time.Time `json:"timestamp"`
}

func writeExit(bundle string, e exitRecord) error {
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(bundle, exitStatusFile), data)
}

func readExit(bundle string) (exitRecord, error) {
	var e exitRecord
	data, err := os.ReadFile(filepath.Join(bundle, exitStatusFile))
	if err != nil {
		return e, err
	}
	if err := json.Unmarshal(data, &e); err != nil {
		return e, fmt.Errorf("parse %s: %w", exitStatusFile, err)
	}
	if e.Pid <= 0 || e.Timestamp.IsZero() {
		return e, fmt.Errorf("invalid exit record %+v", e)
	}
	return e, nil
}

func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
