package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cklite/cklite/integration/bench/report"
)

const mib = 1 << 20

// rows turns the measurements into the table's rows, per workload in the order run.
func rows(all []series, results map[series]map[string]*measured, fanout map[int]map[string]*measured, k int) []report.Row {
	var out []report.Row
	add := func(w, p, metric, unit string, f func(*measured) float64, r map[string]*measured) {
		out = append(out, report.Row{Workload: w, Param: p, Metric: metric, Unit: unit, Cklite: f(r["cklite"]), Stock: f(r["stock"])})
	}
	for _, s := range all {
		r := results[s]
		add(s.workload, s.param, "checkpoint p50", "ms", func(m *measured) float64 { return percentile(m.checkpoint, 0.5) }, r)
		add(s.workload, s.param, "checkpoint p95", "ms", func(m *measured) float64 { return percentile(m.checkpoint, 0.95) }, r)
		add(s.workload, s.param, "downtime p50", "ms", func(m *measured) float64 { return percentile(m.downtime, 0.5) }, r)
		add(s.workload, s.param, "downtime p95", "ms", func(m *measured) float64 { return percentile(m.downtime, 0.95) }, r)
		add(s.workload, s.param, "rollback p50", "ms", func(m *measured) float64 { return percentile(m.rollback, 0.5) }, r)
		add(s.workload, s.param, "rollback p95", "ms", func(m *measured) float64 { return percentile(m.rollback, 0.95) }, r)
		add(s.workload, s.param, fmt.Sprintf("disk after %d ckpts", k), "MiB", func(m *measured) float64 { return float64(m.diskBytes) / mib }, r)
		add(s.workload, s.param, "shim peak RSS", "MiB", func(m *measured) float64 { return float64(m.shimPeak) / mib }, r)
		add(s.workload, s.param, fmt.Sprintf("restores verified (of %d)", r["cklite"].restores), "ok", func(m *measured) float64 { return float64(m.verified) }, r)
	}
	ns := sortedKeys(fanout)
	for _, n := range ns {
		r, p := fanout[n], fmt.Sprintf("%d forks", n)
		add("fan-out", p, "fork each p50", "ms", func(m *measured) float64 { return percentile(m.forkEach, 0.5) }, r)
		add("fan-out", p, "fork total", "ms", func(m *measured) float64 { return msOf(m.forkTotal) }, r)
		add("fan-out", p, "shim peak RSS", "MiB", func(m *measured) float64 { return float64(m.shimPeak) / mib }, r)
		add("fan-out", p, fmt.Sprintf("restores verified (of %d)", n), "ok", func(m *measured) float64 { return float64(m.verified) }, r)
	}
	return out
}

func sortedKeys[V any](m map[int]V) []int {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// latencyChart is checkpoint and rollback p50 of both systems against the size of workload w,
// with the idle workload as size 0.
func latencyChart(title, xlabel, w string, size func(series) int, all []series, results map[series]map[string]*measured) report.Chart {
	c := report.Chart{Title: title, XLabel: xlabel, YLabel: "latency, p50 (ms)"}
	for _, metric := range []string{"checkpoint", "rollback"} {
		for _, sys := range systems {
			s := report.Series{Name: sys + " " + metric, Dashed: metric == "rollback"}
			for _, se := range all {
				if se.workload != w && se.workload != "idle" {
					continue
				}
				m := results[se][sys]
				ds := m.checkpoint
				if metric == "rollback" {
					ds = m.rollback
				}
				s.Points = append(s.Points, report.Point{X: float64(size(se)), Y: percentile(ds, 0.5)})
			}
			slices.SortFunc(s.Points, func(a, b report.Point) int { return int(a.X - b.X) })
			c.Series = append(c.Series, s)
		}
	}
	return c
}

func fanoutChart(fanout map[int]map[string]*measured) report.Chart {
	c := report.Chart{Title: "Fork: total time vs number of forks", XLabel: "forks from one checkpoint", YLabel: "total (ms)"}
	for _, sys := range systems {
		s := report.Series{Name: sys}
		for _, n := range sortedKeys(fanout) {
			s.Points = append(s.Points, report.Point{X: float64(n), Y: msOf(fanout[n][sys].forkTotal)})
		}
		c.Series = append(c.Series, s)
	}
	return c
}

// writeResults prints the table and writes it as CSV and Markdown, with the charts, into o.out.
func writeResults(o options, all []series, results map[series]map[string]*measured, fanout map[int]map[string]*measured, took time.Duration) error {
	rs := rows(all, results, fanout, o.checkpoints)
	fmt.Printf("\nResults (cklite/stock: below 1x cklite takes less time or space), %s in all:\n\n", took.Round(time.Second))
	if err := report.Table(os.Stdout, rs); err != nil {
		return err
	}
	var csvBuf, mdBuf bytes.Buffer
	if err := report.CSV(&csvBuf, rs); err != nil {
		return err
	}
	if err := report.Markdown(&mdBuf, rs); err != nil {
		return err
	}
	files := map[string][]byte{"results.csv": csvBuf.Bytes(), "results.md": mdBuf.Bytes()}
	charts := map[string]report.Chart{
		"latency-vs-memory.svg": latencyChart("Checkpoint and rollback vs memory held", "memory held (MB)", "memory", func(s series) int { return s.memMB }, all, results),
		"latency-vs-rootfs.svg": latencyChart("Checkpoint and rollback vs data in the rootfs", "written to the rootfs (MB)", "filesystem", func(s series) int { return s.rootfsMB }, all, results),
	}
	if len(fanout) > 0 {
		charts["fork-total-vs-n.svg"] = fanoutChart(fanout)
	}
	for name, c := range charts {
		var b bytes.Buffer
		if err := c.SVG(&b); err != nil {
			return err
		}
		files[name] = b.Bytes()
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(o.out, name), data, 0o644); err != nil {
			return err
		}
	}
	abs, _ := filepath.Abs(o.out)
	fmt.Printf("\nWritten to %s: results.csv, results.md, and the charts", abs)
	for name := range charts {
		fmt.Printf(" %s", name)
	}
	fmt.Println()
	return nil
}
