package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cklite/cklite/pkg/checkpoint"
	"github.com/cklite/cklite/pkg/pagechain"
)

// memoryStore is a sandbox whose checkpoints' memory is stored, after the checkpoint and in the
// background, as what changed since the parent checkpoint's (cklite: pkg/pagechain). Its disk is
// measured once that is done, and its memory reported twice: as dumped (logical) and as stored.
type memoryStore interface {
	// settle waits until the store is done with checkpoint i (or declined it).
	settle(i int) error
	// memoryDisk is the memory of the checkpoints taken so far, as dumped and as stored.
	memoryDisk() (logical, stored int64, err error)
	// checkpointID is checkpoint i's id ("" when it failed).
	checkpointID(i int) string
	// storedAgainst is the checkpoint whose images checkpoint i's memory was stored against,
	// once settled: "" for a full dump.
	storedAgainst(i int) (string, error)
}

// settled waits until b's memory store, if it has one, is done with checkpoint i.
func settled(b sandbox, i int) error {
	if ms, ok := b.(memoryStore); ok {
		return ms.settle(i)
	}
	return nil
}

// memoryOf is the memory of b's checkpoints as dumped and as stored; 0 without a memory store.
func memoryOf(b sandbox) (logical, stored int64, err error) {
	if ms, ok := b.(memoryStore); ok {
		return ms.memoryDisk()
	}
	return 0, 0, nil
}

// checkpointID is b's checkpoint i's id, "" without a memory store.
func checkpointID(b sandbox, i int) string {
	if ms, ok := b.(memoryStore); ok {
		return ms.checkpointID(i)
	}
	return ""
}

// storedAgainst is the checkpoint b's checkpoint i is stored against, "" without a memory store.
func storedAgainst(b sandbox, i int) (string, error) {
	if ms, ok := b.(memoryStore); ok {
		return ms.storedAgainst(i)
	}
	return "", nil
}

// settleTimeout bounds the wait for a deduplication: the shim runs one at a time, each reading
// two dumps, on a machine other benchmarks may be loading too.
const settleTimeout = 5 * time.Minute

// settle waits for pagechain.ReportFile in checkpoint i's image directory: the shim writes it,
// atomically, when the directory has its final form (deduplicated, or left a full dump).
func (s *ckliteBox) settle(i int) error {
	dir, ok := s.dirs[i]
	if !ok {
		return nil // checkpoint i failed: nothing to wait for
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(settleTimeout)
	for {
		_, err := os.Stat(filepath.Join(dir, pagechain.ReportFile))
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		select {
		case <-s.ctx.Done():
			return s.ctx.Err()
		case <-deadline:
			return fmt.Errorf("no %s in %s after %v: the shim's deduplication did not finish", pagechain.ReportFile, dir, settleTimeout)
		case <-tick.C:
		}
	}
}

func (s *ckliteBox) checkpointID(i int) string { return s.ids[i] }

// storedAgainst reads the parent from checkpoint i's pagechain.ReportFile.
func (s *ckliteBox) storedAgainst(i int) (string, error) {
	dir, ok := s.dirs[i]
	if !ok {
		return "", fmt.Errorf("no checkpoint %d", i)
	}
	r, err := pagechain.ReadReport(dir)
	return r.Parent, err
}

// memoryDisk sums, over the container's image directories, the size of the images as CRIU wrote
// them (cklite.json's memoryBytes) and the disk they take now: allocated blocks, as du counts
// them (hard links to a parent's files once; pages stored compressed at their compressed size,
// rounded to blocks), less cklite's own files (cklite.json, pagechain.json).
func (s *ckliteBox) memoryDisk() (logical, stored int64, err error) {
	var dirs, own []string
	for _, dir := range s.dirs {
		m, err := checkpoint.Read(dir)
		if err != nil {
			return 0, 0, err
		}
		logical += m.MemoryBytes
		dirs = append(dirs, dir)
		own = append(own, filepath.Join(dir, checkpoint.MetaFile), filepath.Join(dir, pagechain.ReportFile))
	}
	all, err := diskUsage(dirs...)
	if err != nil {
		return 0, 0, err
	}
	ours, err := diskUsage(own...)
	if err != nil {
		return 0, 0, err
	}
	return logical, all - ours, nil
}
