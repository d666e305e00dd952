package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// output is how a command prints its results, the same on every command (docs/cli.md): for
// people (the default), ids only (-q: one a line, for $(...) and xargs), or JSON (--format json:
// one object for a command about one thing, a list for a command about several; stable field
// names). Whatever the format, stdout holds results only: errors and warnings go to stderr, and
// progress too, but only when stderr is a terminal (progressTo).
type output struct {
	quiet  bool
	format string
}

// outputFlags declares -q/--quiet and --format on fs; quiet says what -q prints.
func outputFlags(fs *flag.FlagSet, quiet string) *output {
	o := &output{}
	fs.BoolVar(&o.quiet, "quiet", false, "print only "+quiet+", one a line")
	fs.BoolVar(&o.quiet, "q", false, "short for --quiet")
	fs.StringVar(&o.format, "format", "table", "`FORMAT`: table (for people) or json")
	return o
}

// check refuses a format other than table and json, and -q with json.
func (o *output) check() error {
	switch {
	case o.format != "table" && o.format != "json":
		return usageError("--format %q: want table or json", o.format)
	case o.quiet && o.format == "json":
		return usageError("-q and --format json exclude each other")
	}
	return nil
}

func (o *output) json() bool { return o.format == "json" }

// human reports whether the default, human-readable output is wanted.
func (o *output) human() bool { return !o.quiet && !o.json() }

// ids prints ids one a line.
func (o *output) ids(w io.Writer, ids ...string) {
	for _, id := range ids {
		fmt.Fprintln(w, id)
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// progressTo is where a command reports its progress: stderr when it is a terminal, else nowhere,
// so that pipes and logs get results and errors only.
func progressTo(stderr io.Writer) io.Writer {
	if f, ok := stderr.(*os.File); ok {
		if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err == nil {
			return stderr
		}
	}
	return io.Discard
}
