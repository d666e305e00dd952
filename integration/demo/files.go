package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	"github.com/cklite/cklite/integration/workload"
)

// The agent's files, in its root filesystem as the host sees it: /work/notes.txt and, in the
// larger scenarios, /work/data, both written anew each round before the checkpoint; and the
// image's /etc/passwd, which the bad action overwrites.
const (
	workDir    = "work"
	notesFile  = "work/notes.txt"
	dataDir    = "work/data"
	passwdFile = "etc/passwd"
	blobMB     = 10 // the data is written as files of this size
	blobCheck  = 4096
)

func notes(rep int) string { return fmt.Sprintf("round %d: the agent's notes\n", rep) }

// writeWork writes the agent's work of round rep: its notes and, when mb > 0, mb MB of
// incompressible data into /work/data (what was there is removed first), as files of blobMB MB.
func writeWork(rootfs string, rep, mb int) error {
	if err := os.MkdirAll(filepath.Join(rootfs, workDir), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(rootfs, notesFile), []byte(notes(rep)), 0o644); err != nil || mb == 0 {
		return err
	}
	dir := filepath.Join(rootfs, dataDir)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	for i := 0; i*blobMB < mb; i++ {
		f, err := os.Create(filepath.Join(dir, blobName(i)))
		if err != nil {
			return err
		}
		_, err = io.CopyN(f, blob(rep, i), int64(min(blobMB, mb-i*blobMB))<<20)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("writing %s: %w", f.Name(), err)
		}
	}
	return nil
}

func blobName(i int) string { return fmt.Sprintf("blob-%03d", i) }

// blob is the content of data file i of round rep: a random stream seeded by both, so that it
// can be checked and no two rounds write the same.
func blob(rep, i int) io.Reader {
	var seed [32]byte
	seed[0], seed[1], seed[2], seed[3] = byte(i), byte(i>>8), byte(rep), byte(rep>>8)
	return rand.NewChaCha8(seed)
}

// checkData checks /work/data holds the mb MB writeWork wrote in round rep: every file, its size,
// and the start of its content.
func checkData(rootfs string, rep, mb int) error {
	for i := 0; i*blobMB < mb; i++ {
		if err := checkBlob(filepath.Join(rootfs, dataDir, blobName(i)), rep, i, int64(min(blobMB, mb-i*blobMB))<<20); err != nil {
			return err
		}
	}
	return nil
}

func checkBlob(name string, rep, i int, size int64) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() != size {
		return fmt.Errorf("%s has %d bytes, want %d", name, fi.Size(), size)
	}
	got, want := make([]byte, blobCheck), make([]byte, blobCheck)
	if _, err := io.ReadFull(f, got); err != nil {
		return err
	}
	_, _ = io.ReadFull(blob(rep, i), want)
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%s does not hold the data written", name)
	}
	return nil
}

// badAction is what the agent should not have done: it deletes its work and overwrites a file of
// the image.
func badAction(rootfs string) error {
	if err := os.RemoveAll(filepath.Join(rootfs, workDir)); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(rootfs, passwdFile), []byte("oops\n"), 0o644)
}

// expectCheckpointed checks the container whose root filesystem is rootfs holds the checkpoint
// taken in round rep of a scenario with mb MB of data: the agent at exactly `at`, the same process
// (token), counting on from there, and the files as they were.
func expectCheckpointed(ctx context.Context, rootfs string, at workload.Count, rep, mb int) error {
	if err := (workload.Counter{Rootfs: rootfs}).ExpectRestored(ctx, at); err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(rootfs, notesFile))
	if err != nil {
		return fmt.Errorf("/%s: %w", notesFile, err)
	}
	if string(data) != notes(rep) {
		return fmt.Errorf("/%s holds %q, want %q", notesFile, data, notes(rep))
	}
	if data, err = os.ReadFile(filepath.Join(rootfs, passwdFile)); err != nil || !strings.HasPrefix(string(data), "root:") {
		return errors.Join(fmt.Errorf("/%s holds %q, want the image's", passwdFile, data), err)
	}
	return checkData(rootfs, rep, mb)
}
