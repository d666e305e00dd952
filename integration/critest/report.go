package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
)

// specReport is what this program reads of a spec in Ginkgo's JSON report (--ginkgo.json-report,
// a list of types.Report; enums are their names).
type specReport struct {
	ContainerHierarchyTexts []string
	LeafNodeType            string
	LeafNodeText            string
	State                   string
	Failure                 struct{ Message string }
	NumAttempts             int
}

// outcome is a case's result with one handler.
type outcome struct {
	state   string // passed, failed, skipped, or "not run" (left out by -focus / -skip)
	message string // the failure's or the skip's message
}

// results are one handler's outcomes by case name.
type results map[string]outcome

// readReport reads the It specs of a Ginkgo JSON report. A spec Ginkgo skipped without a message
// was filtered out (focus, skip) and never ran.
func readReport(path string) (results, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var reports []struct{ SpecReports []specReport }
	if err := json.Unmarshal(data, &reports); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	res := results{}
	for _, r := range reports {
		for _, s := range r.SpecReports {
			if s.LeafNodeType != "It" {
				continue
			}
			o := outcome{state: s.State, message: strings.TrimSpace(s.Failure.Message)}
			switch {
			case s.State == "skipped" && (o.message == "" || s.NumAttempts == 0):
				o.state = "not run"
			case s.State != "passed" && s.State != "skipped":
				o.state = "failed" // failed, panicked, timedout, interrupted, aborted
			}
			res[strings.Join(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText), " ")] = o
		}
	}
	return res, nil
}

// count returns how many cases ended in state.
func (r results) count(state string) int {
	n := 0
	for _, o := range r {
		if o.state == state {
			n++
		}
	}
	return n
}

// printSummary writes each handler's counts, then every case whose outcome is not the same with
// every handler, with each handler's state and message.
func printSummary(w io.Writer, handlers []string, all map[string]results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "handler\tpassed\tfailed\tskipped\tnot run")
	for _, h := range handlers {
		r := all[h]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", h, r.count("passed"), r.count("failed"), r.count("skipped"), r.count("not run"))
	}
	tw.Flush()
	diff := differing(handlers, all)
	fmt.Fprintf(w, "\n%d cases differ between %s\n", len(diff), strings.Join(handlers, " and "))
	for _, name := range diff {
		fmt.Fprintf(w, "- %s\n", name)
		for _, h := range handlers {
			o := all[h][name]
			fmt.Fprintf(w, "    %s: %s", h, o.state)
			if o.message != "" && o.state != "passed" {
				fmt.Fprintf(w, ": %s", firstLine(o.message))
			}
			fmt.Fprintln(w)
		}
	}
}

// differing names, sorted, the cases whose state is not the same with every handler.
func differing(handlers []string, all map[string]results) []string {
	names := map[string]bool{}
	for _, h := range handlers {
		for name := range all[h] {
			names[name] = true
		}
	}
	var diff []string
	for name := range names {
		for _, h := range handlers[1:] {
			if all[h][name].state != all[handlers[0]][name].state {
				diff = append(diff, name)
				break
			}
		}
	}
	slices.Sort(diff)
	return diff
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	const limit = 200
	if len(line) > limit {
		line = line[:limit] + "..."
	}
	return line
}
