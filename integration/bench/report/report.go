// Package report turns the checkpoint benchmark's measurements into what a reader gets: a table of
// cklite next to stock with their ratio, the same rows as CSV, and SVG line charts. It knows
// nothing about containers, so that the benchmark's workloads and its output stay apart.
package report

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Row is one metric of one workload, for both systems. A value that was not measured (stock
// cannot do it, say) is NaN and shows as "-".
type Row struct {
	Workload string // "idle", "memory", "filesystem", "fan-out"
	Param    string // "256 MB", "10 forks", ...
	Metric   string // "checkpoint p50", ...
	Unit     string // "ms", "MiB", "ok/total"
	Cklite   float64
	Stock    float64
	// Failed and Retried count the workload's operations that failed and that were retried, per
	// system (cklite, stock): the same on every row of one workload and param.
	Failed, Retried [2]int
}

// counts shows a workload's failed or retried operations on its first row ("cklite / stock"),
// leaving the rest of its rows blank.
func counts(rows []Row, i int, c func(Row) [2]int) string {
	if i > 0 && rows[i-1].Workload == rows[i].Workload && rows[i-1].Param == rows[i].Param {
		return ""
	}
	v := c(rows[i])
	return fmt.Sprintf("%d / %d", v[0], v[1])
}

func failed(r Row) [2]int  { return r.Failed }
func retried(r Row) [2]int { return r.Retried }

// Ratio is cklite's value over stock's: below 1 cklite takes less time or space.
func (r Row) Ratio() float64 {
	if math.IsNaN(r.Cklite) || math.IsNaN(r.Stock) || r.Stock == 0 {
		return math.NaN()
	}
	return r.Cklite / r.Stock
}

func format(v float64, unit string) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case unit == "":
		return strconv.FormatFloat(v, 'f', -1, 64)
	case unit == "ms" && v < 10:
		return fmt.Sprintf("%.1f %s", v, unit)
	case unit == "ms" || unit == "MiB" || unit == "KiB":
		return fmt.Sprintf("%.0f %s", v, unit)
	default:
		return strconv.FormatFloat(v, 'f', -1, 64) + " " + unit
	}
}

func formatRatio(r float64) string {
	if math.IsNaN(r) {
		return "-"
	}
	return fmt.Sprintf("%.2fx", r)
}

// Table writes rows as an aligned text table.
func Table(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "workload\tparam\tmetric\tcklite\tstock\tcklite/stock\tfailed c/s\tretried c/s\t")
	fmt.Fprintln(tw, "--------\t-----\t------\t------\t-----\t------------\t----------\t-----------\t")
	for i, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Workload, r.Param, r.Metric,
			format(r.Cklite, r.Unit), format(r.Stock, r.Unit), formatRatio(r.Ratio()),
			counts(rows, i, failed), counts(rows, i, retried))
	}
	return tw.Flush()
}

// Markdown writes rows as a Markdown table, for the README.
func Markdown(w io.Writer, rows []Row) error {
	var b strings.Builder
	b.WriteString("| workload | param | metric | cklite | stock | cklite/stock | failed (cklite / stock) | retried (cklite / stock) |\n|---|---|---|---|---|---|---|---|\n")
	for i, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Workload, r.Param, r.Metric,
			format(r.Cklite, r.Unit), format(r.Stock, r.Unit), formatRatio(r.Ratio()),
			counts(rows, i, failed), counts(rows, i, retried))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// CSV writes rows with a header; values are plain numbers, empty when not measured.
func CSV(w io.Writer, rows []Row) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"workload", "param", "metric", "unit", "cklite", "stock", "cklite_over_stock",
		"cklite_failed", "stock_failed", "cklite_retried", "stock_retried"})
	num := func(v float64) string {
		if math.IsNaN(v) {
			return ""
		}
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	for _, r := range rows {
		_ = cw.Write([]string{r.Workload, r.Param, r.Metric, r.Unit, num(r.Cklite), num(r.Stock), num(r.Ratio()),
			strconv.Itoa(r.Failed[0]), strconv.Itoa(r.Failed[1]), strconv.Itoa(r.Retried[0]), strconv.Itoa(r.Retried[1])})
	}
	cw.Flush()
	return cw.Error()
}
