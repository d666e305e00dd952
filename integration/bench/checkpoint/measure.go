package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// percentile of ds by nearest rank, in milliseconds; NaN for none.
func percentile(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return math.NaN()
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return msOf(s[max(i, 0)])
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}

// diskUsage is what du reports for dirs: allocated blocks, hard links counted once, not crossing
// into other file systems (a container's mounted rootfs is not its snapshot's disk use).
func diskUsage(dirs ...string) (int64, error) {
	seen := map[[2]uint64]bool{}
	var total int64
	for _, dir := range dirs {
		root, err := os.Lstat(dir)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return 0, err
		}
		dev := root.Sys().(*syscall.Stat_t).Dev
		err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				// Snapshots and checkpoints of other containers come and go meanwhile.
				if os.IsNotExist(err) {
					return nil
				}
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Dev != dev {
				return filepath.SkipDir
			}
			key := [2]uint64{st.Dev, st.Ino}
			if !seen[key] {
				seen[key] = true
				total += st.Blocks * 512
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("du %s: %w", dir, err)
		}
	}
	return total, nil
}

// downtime reads the probe's gap records in rootfs and returns the longest gap that ended
// between from and to: how long the container's processes stood still for a checkpoint taken
// in that window. Gaps shorter than the probe's -min-gap are not recorded; then it returns 0.
func downtime(rootfs string, from, to time.Time) (time.Duration, error) {
	f, err := os.Open(filepath.Join(rootfs, "tmp", "gaps"))
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var longest time.Duration
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var end, gap int64
		if _, err := fmt.Sscanf(sc.Text(), "%d %d", &end, &gap); err != nil {
			continue // a line cut short by a checkpoint is no measurement
		}
		if t := time.Unix(0, end); t.After(from) && t.Before(to) {
			longest = max(longest, time.Duration(gap))
		}
	}
	return longest, sc.Err()
}

// probeStatus is what the probe last wrote: its token and tick count.
func probeStatus(rootfs string) (token string, ticks int64, err error) {
	data, err := os.ReadFile(filepath.Join(rootfs, "tmp", "probe"))
	if err != nil {
		return "", 0, err
	}
	var sum int64
	if _, err := fmt.Sscanf(string(data), "%s %d %d", &token, &ticks, &sum); err != nil {
		return "", 0, fmt.Errorf("probe status %q: %w", data, err)
	}
	return token, ticks, nil
}

// waitProbe waits until the probe in rootfs runs with token (any, when "") and has ticked past
// what it had, and returns its token: a restored probe is the same process, alive.
func waitProbe(rootfs, token string) (string, error) {
	_, before, _ := probeStatus(rootfs)
	deadline := time.Now().Add(30 * time.Second)
	for {
		tok, ticks, err := probeStatus(rootfs)
		if err == nil && (token == "" || tok == token) && ticks > before {
			return tok, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("probe in %s: want token %q ticking, last read %q %d (error %v)", rootfs, token, tok, ticks, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The filesystem workload's files, in the rootfs as the host sees it: /work/data holds the M MB
// written once, /work/delta the 1 MB changed before every checkpoint.
const (
	dataDir   = "work/data"
	deltaFile = "work/delta"
	blobMB    = 10
)

// stream is incompressible content seeded by what names it, so it can be checked later.
func stream(a, b int) io.Reader {
	var seed [32]byte
	seed[0], seed[1], seed[2], seed[3] = byte(a), byte(a>>8), byte(b), byte(b>>8)
	return rand.NewChaCha8(seed)
}

// writeData writes mb MB into /work/data as files of blobMB MB.
func writeData(rootfs string, mb int) error {
	dir := filepath.Join(rootfs, dataDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := 0; i*blobMB < mb; i++ {
		if err := writeFile(filepath.Join(dir, fmt.Sprintf("blob-%03d", i)), stream(1000, i), int64(min(blobMB, mb-i*blobMB))<<20); err != nil {
			return err
		}
	}
	return nil
}

// checkData checks the size and first 4 KiB of every file writeData wrote.
func checkData(rootfs string, mb int) error {
	for i := 0; i*blobMB < mb; i++ {
		name := filepath.Join(rootfs, dataDir, fmt.Sprintf("blob-%03d", i))
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		fi, err := f.Stat()
		got := make([]byte, 4096)
		if err == nil {
			_, err = io.ReadFull(f, got)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		want := make([]byte, 4096)
		_, _ = io.ReadFull(stream(1000, i), want)
		if fi.Size() != int64(min(blobMB, mb-i*blobMB))<<20 || !bytes.Equal(got, want) {
			return fmt.Errorf("%s does not hold the data written", name)
		}
	}
	return nil
}

// writeDelta writes the 1 MB of checkpoint i.
func writeDelta(rootfs string, i int) error {
	if err := os.MkdirAll(filepath.Join(rootfs, "work"), 0o755); err != nil {
		return err
	}
	return writeFile(filepath.Join(rootfs, deltaFile), stream(2000, i), 1<<20)
}

// checkDelta checks /work/delta holds checkpoint i's 1 MB, by hash.
func checkDelta(rootfs string, i int) error {
	got, err := os.ReadFile(filepath.Join(rootfs, deltaFile))
	if err != nil {
		return err
	}
	want, _ := io.ReadAll(io.LimitReader(stream(2000, i), 1<<20))
	if sha256.Sum256(got) != sha256.Sum256(want) {
		return fmt.Errorf("/%s does not hold checkpoint %d's content", deltaFile, i)
	}
	return nil
}

func writeFile(name string, r io.Reader, size int64) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	_, err = io.CopyN(f, r, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return nil
}

// badAction is what a rollback undoes: the work deleted, a file of the image overwritten.
func badAction(rootfs string) error {
	if err := os.RemoveAll(filepath.Join(rootfs, "work")); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(rootfs, "etc", "passwd"), []byte("oops\n"), 0o644)
}

func checkPasswd(rootfs string) error {
	data, err := os.ReadFile(filepath.Join(rootfs, "etc", "passwd"))
	if err != nil {
		return err
	}
	if !strings.HasPrefix(string(data), "root:") {
		return fmt.Errorf("/etc/passwd holds %q, want the image's", data)
	}
	return nil
}
