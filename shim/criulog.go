package shim

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// maxQuotedErrors bounds how many of CRIU's error lines an error message quotes: the first
// ones name the cause, the rest are usually "Dumping FAILED" and its consequences.
const maxQuotedErrors = 4

// keepRestoreLog is keepDumpLog for CRIU's restore.log.
func keepRestoreLog(bundle, work string, cause error) error {
	return keepCRIULog(bundle, work, "restore.log", cause)
}

// keepDumpLog saves CRIU's dump.log next to the bundle, where it survives the work directory,
// and names it in the error with the errors it reports: libcontainer only says "criu failed".
func keepDumpLog(bundle, work string, cause error) error {
	return keepCRIULog(bundle, work, "dump.log", cause)
}

func keepCRIULog(bundle, work, name string, cause error) error {
	data, err := os.ReadFile(filepath.Join(work, name))
	if err != nil {
		return cause
	}
	kept := filepath.Join(bundle, "criu-"+name)
	if err := os.WriteFile(kept, data, 0o600); err != nil {
		kept = filepath.Join(work, name)
	}
	if quoted := criuErrors(data); len(quoted) > 0 {
		return fmt.Errorf("%w: CRIU says: %s (CRIU log: %s)", cause, strings.Join(quoted, "; "), kept)
	}
	return fmt.Errorf("%w (CRIU log: %s)", cause, kept)
}

// criuErrors returns the messages of the first error lines of a CRIU log, without their
// timestamps and source positions, e.g. "Can't open pages-1.img: No such file or directory".
func criuErrors(log []byte) []string {
	var quoted []string
	s := bufio.NewScanner(bytes.NewReader(log))
	for s.Scan() && len(quoted) < maxQuotedErrors {
		line := s.Text()
		i := strings.Index(line, "Error (")
		if i < 0 {
			continue
		}
		if strings.Contains(line, "RLIMIT_NOFILE") {
			// CRIU fails to raise its own file limit under a shim's limits and carries on:
			// never the cause.
			continue
		}
		msg := line[i:]
		if j := strings.Index(msg, "): "); j >= 0 {
			msg = msg[j+3:]
		}
		quoted = append(quoted, strings.TrimSpace(msg))
	}
	return quoted
}
