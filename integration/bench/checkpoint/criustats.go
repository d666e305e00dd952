package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"
)

// criuStats is CRIU's own account of one dump (stats-dump) and, where the same work directory
// saw a restore too (cklite's checkpoint restores the container in place onto a fresh upper
// layer), of that restore (stats-restore). CRIU counts in microseconds.
type criuStats struct {
	freezing, frozen, memdump, memwrite time.Duration // dump: freezing the tree, tasks frozen, collecting pages, writing them
	pagesWritten                        uint64
	restore                             time.Duration // restore: the time CRIU spent restoring; 0 without stats-restore
}

// readCRIUStats reads the stats files CRIU left in work, the WorkPath the checkpoint named.
func readCRIUStats(work string) (criuStats, error) {
	dir, err := os.Open(work)
	if err != nil {
		return criuStats{}, err
	}
	defer dir.Close()
	d, err := stats.CriuGetDumpStats(dir)
	if err != nil {
		return criuStats{}, err
	}
	us := func(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }
	s := criuStats{
		freezing: us(d.GetFreezingTime()), frozen: us(d.GetFrozenTime()),
		memdump: us(d.GetMemdumpTime()), memwrite: us(d.GetMemwriteTime()),
		pagesWritten: d.GetPagesWritten(),
	}
	r, err := stats.CriuGetRestoreStats(dir)
	switch {
	case err == nil:
		s.restore = us(r.GetRestoreTime())
	case !errors.Is(err, os.ErrNotExist):
		return s, err
	}
	return s, nil
}

// workDir is where checkpoint i of container id has CRIU write its logs and stats: outside the
// image directory, so that it is not counted as the checkpoint's disk use. It is created here,
// as runc's --work-path is, and removed with removeWorkDirs.
func (e *daemon) workDir(id string, i int) (string, error) {
	dir := filepath.Join(e.d.Dir, "criu-work", id, fmt.Sprint(i))
	return dir, os.MkdirAll(dir, 0o700)
}

func (e *daemon) removeWorkDirs(id string) error {
	return os.RemoveAll(filepath.Join(e.d.Dir, "criu-work", id))
}

// criuStats reads the stats of checkpoint i of container id.
func (e *daemon) criuStats(id string, i int) (criuStats, error) {
	work, err := e.workDir(id, i)
	if err != nil {
		return criuStats{}, err
	}
	return readCRIUStats(work)
}
