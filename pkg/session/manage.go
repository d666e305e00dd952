package session

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// Info is a live session.
type Info struct {
	Name    string    `json:"name"`
	PID     int       `json:"pid"` // the shell's, in the container's PID namespace
	Created time.Time `json:"created"`
	Shell   string    `json:"shell"` // bash or sh
}

// List returns the container's live sessions, by name.
func (s *Sessions) List(ctx context.Context) ([]Info, error) {
	var out bytes.Buffer
	if err := s.opsErr(ctx, &out, "list", s.dir, ""); err != nil {
		return nil, err
	}
	return parseList(out.String())
}

// parseList parses what ops.sh list prints: NAME PID CREATED SHELL, tab-separated, a line each.
func parseList(out string) ([]Info, error) {
	var infos []Info
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			return nil, fmt.Errorf("session list: line %q: want 4 fields", line)
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil {
			return nil, fmt.Errorf("session list: line %q: pid: %w", line, err)
		}
		created, err := time.Parse(time.RFC3339, f[2])
		if err != nil {
			return nil, fmt.Errorf("session list: line %q: created: %w", line, err)
		}
		infos = append(infos, Info{Name: f[0], PID: pid, Created: created, Shell: f[3]})
	}
	return infos, nil
}

// closedNone is ops.sh close's status when there is no such session.
const closedNone = 3

// Close ends session name: its shell and every process it started (background jobs included).
// No such session is errdefs.ErrNotFound.
func (s *Sessions) Close(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	var stderr limitedBuffer
	st, err := s.ops(ctx, nil, &stderr, "close", s.dir, name)
	switch {
	case err != nil:
		return err
	case st == closedNone:
		return fmt.Errorf("no session %q: %w", name, errdefs.ErrNotFound)
	case st != 0:
		return fmt.Errorf("close session %s: exit status %d: %s", name, st, stderr.String())
	}
	return nil
}

// limitedBuffer keeps the first 4 KiB written to it, for error messages.
type limitedBuffer struct{ b bytes.Buffer }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := 4096 - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string { return strings.TrimSpace(l.b.String()) }
