package main

import (
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/docker/go-units"

	"github.com/cklite/cklite/pkg/checkpoint"
	ckclient "github.com/cklite/cklite/pkg/client"
)

// lsWidth is the width `cklite checkpoint ls` fits its lines in: what a terminal shows, pasted
// into an issue or a chat, unwrapped.
const lsWidth = 100

// maxIndent bounds the tree drawn before an id (5 levels of checkpoint.Line's 3 columns):
// deeper checkpoints are drawn at this depth, the top of their branches cut to "…", so that a
// chain of a thousand checkpoints fits as well.
const maxIndent = 15

// lsView is what `cklite checkpoint ls` draws: the tree, and how to describe a checkpoint (the
// sizes of its stored memory and of its frozen layer).
type lsView struct {
	tree     *ckclient.Tree
	describe func(checkpoint.Record) ckclient.Checkpoint
	now      time.Time
}

// lsColumns are the columns, and how narrow those that shrink (truncated with "…") get when the
// lines would not fit lsWidth: the names, which may be any length (NOW keeps at least "◀" and a
// short id, CONTAINER its header); ids, sizes and ages never shrink.
var lsColumns = []struct {
	header string
	min    int // 0: never shrinks
}{
	{"CHECKPOINT", 0}, {"NAME", 6}, {"CONTAINER", 9}, {"AGE", 0},
	{"MEMORY", 0}, {"STORED", 0}, {"FILES", 0}, {"EXPIRES", 0}, {"NOW", 14},
}

// write draws the tree: one checkpoint a line, children under their parent (oldest first), its
// name, the container it was taken of (nerdctl's name, or the id's first 12 digits), its age,
// the sizes of its memory (as dumped, and as stored: see memStored) and its frozen layer, its
// expiry (the column only when one expires),
// and in NOW "◀" and the containers whose current state it is.
func (v lsView) write(w io.Writer) error {
	rows := [][]string{}
	expiring := false
	for _, l := range v.tree.Lines() {
		id := indent(l.Indent) + l.ID
		if l.Orphan {
			id += " (parent gone)"
		}
		memory := "-"
		if l.Contents.HasMemory() {
			memory = size(l.MemoryBytes)
		}
		d := v.describe(l.Record)
		expiring = expiring || !l.Expires.IsZero()
		rows = append(rows, []string{id, orDash(l.Name), v.container(l.Container), age(v.now.Sub(l.Created)),
			memory, memStored(d), fsSize(d), expires(l.Expires, v.now), v.current(l.Current)})
	}
	cols := make([]bool, len(lsColumns)) // shown
	for i := range cols {
		cols[i] = lsColumns[i].header != "EXPIRES" || expiring
	}
	widths := fit(rows, cols)
	header := make([]string, len(lsColumns))
	for i, c := range lsColumns {
		header[i] = c.header
	}
	for _, row := range append([][]string{header}, rows...) {
		if _, err := fmt.Fprintln(w, line(row, cols, widths)); err != nil {
			return err
		}
	}
	return nil
}

// fit returns the columns' widths: each as wide as its widest cell, the shrinking ones narrowed
// (the one farthest above its minimum first) until a line fits lsWidth.
func fit(rows [][]string, shown []bool) []int {
	widths := make([]int, len(lsColumns))
	for i, c := range lsColumns {
		widths[i] = utf8.RuneCountInString(c.header)
	}
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	total := func() int {
		n := 0
		for i, w := range widths {
			if shown[i] {
				n += w + 2
			}
		}
		return n - 2
	}
	for total() > lsWidth {
		widest := -1
		slack := func(i int) int { return widths[i] - lsColumns[i].min }
		for i, c := range lsColumns {
			if c.min > 0 && shown[i] && slack(i) > 0 && (widest < 0 || slack(i) > slack(widest)) {
				widest = i
			}
		}
		if widest < 0 {
			break // only a tree deeper than maxIndent with long ids could: nothing left to shrink
		}
		widths[widest]--
	}
	return widths
}

// line is row's shown cells, each cut or padded to its width, without trailing blanks.
func line(row []string, shown []bool, widths []int) string {
	var b strings.Builder
	for i, cell := range row {
		if !shown[i] {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("  ")
		}
		b.WriteString(cut(cell, widths[i]))
		b.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cut(cell, widths[i]))))
	}
	return strings.TrimRight(b.String(), " ")
}

// cut shortens s to n runes, its end replaced by "…".
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// indent bounds a tree prefix to maxIndent runes, keeping its end (the branches nearest the id)
// and marking the levels left out with "…".
func indent(s string) string {
	r := []rune(s)
	if len(r) <= maxIndent {
		return s
	}
	return "…  " + string(r[len(r)-maxIndent+3:])
}

// container names container id: its nerdctl name, else its id's first 12 digits.
func (v lsView) container(id string) string {
	if c, ok := v.tree.Containers[id]; ok && c.Name != "" {
		return c.Name
	}
	return shortID(id)
}

// current is the NOW column: the containers whose state the checkpoint is.
func (v lsView) current(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = v.container(id)
	}
	return "◀ " + strings.Join(names, " ")
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// age is a duration in one unit, as the AGE column shows it: 45s, 12m, 5h, 3d.
func age(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(0, int(d.Seconds())))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// expires is the EXPIRES column. A checkpoint past its expiry is still listed until containerd's
// garbage collector next runs.
func expires(at, now time.Time) string {
	switch {
	case at.IsZero():
		return "-"
	case !at.After(now):
		return "expired"
	}
	return "in " + age(at.Sub(now))
}

// fsSize is the FILES column: "-" without a frozen layer, "?" when its usage is unknown.
func fsSize(v ckclient.Checkpoint) string {
	switch {
	case !v.Contents.HasFS():
		return "-"
	case v.Filesystem == nil:
		return "?"
	}
	return size(v.Filesystem.Bytes)
}

// memStored is the STORED column: the disk the memory takes in the image directory now, less
// than MEMORY once the shim has found pages in the parent checkpoint's images; "-" without a
// memory dump, "?" when the directory is gone or holds another checkpoint.
func memStored(v ckclient.Checkpoint) string {
	switch {
	case !v.Contents.HasMemory():
		return "-"
	case v.MemoryStoredBytes == nil:
		return "?"
	}
	return size(*v.MemoryStoredBytes)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// size is a size in at most 3 digits: 4.2MB, 443kB.
func size(bytes int64) string { return units.HumanSizeWithPrecision(float64(bytes), 3) }
