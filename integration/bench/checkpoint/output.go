package main

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cklite/cklite/integration/bench/report"
)

const mib = 1 << 20

// results is everything one run measured, by workload and system.
type results struct {
	series   []series // in the order run
	bySeries map[series]map[string]*measured
	fanout   map[int]map[string]*measured
	execs    map[string]*measured // nil when left out
	tree     map[string]*measured // nil when left out
	forked   *measured            // cklite's fork checkpoints, nil when left out
	// forkedParam names the fork checkpoints' row group.
	forkedParam string
	// treeParam names the tree search's row group.
	treeParam string
	rec       *recorder
}

// metric is one row of the table, computed for each system.
type metric struct {
	name, unit string
	f          func(*measured) float64
}

func p50(ds func(*measured) []time.Duration) func(*measured) float64 {
	return func(m *measured) float64 { return percentile(ds(m), 0.5) }
}

func p95(ds func(*measured) []time.Duration) func(*measured) float64 {
	return func(m *measured) float64 { return percentile(ds(m), 0.95) }
}

// criuP50 is the median of one of CRIU's times over a system's checkpoints; NaN where CRIU did
// not report it (stock's checkpoints restore nothing).
func criuP50(t func(criuStats) time.Duration) func(*measured) float64 {
	return func(m *measured) float64 {
		var ds []time.Duration
		for _, c := range m.criu {
			if t(c) > 0 {
				ds = append(ds, t(c))
			}
		}
		return percentile(ds, 0.5)
	}
}

func mibOf[T int64 | uint64](v T) float64 { return float64(v) / mib }

// orNaN turns a value that was not measured (0) into NaN, shown as "-".
func orNaN(v float64) float64 {
	if v == 0 {
		return math.NaN()
	}
	return v
}

var (
	ckpt = func(m *measured) []time.Duration { return m.checkpoint }
	roll = func(m *measured) []time.Duration { return m.rollback }
	down = func(m *measured) []time.Duration { return m.downtime }

	// criuMetrics break a dump down as CRIU's stats-dump does, and cklite's in-place restore as
	// its stats-restore does.
	criuMetrics = []metric{
		{"CRIU freezing p50", "ms", criuP50(func(c criuStats) time.Duration { return c.freezing })},
		{"CRIU frozen p50", "ms", criuP50(func(c criuStats) time.Duration { return c.frozen })},
		{"CRIU memdump p50", "ms", criuP50(func(c criuStats) time.Duration { return c.memdump })},
		{"CRIU memwrite p50", "ms", criuP50(func(c criuStats) time.Duration { return c.memwrite })},
		{"CRIU restore in ckpt p50", "ms", criuP50(func(c criuStats) time.Duration { return c.restore })},
	}
	memoryMetrics = []metric{
		{"shim peak RSS", "MiB", func(m *measured) float64 { return orNaN(mibOf(m.shimPeak)) }},
		{"snapshotter peak RSS", "MiB", func(m *measured) float64 { return orNaN(mibOf(m.snapshotterPeak)) }},
	}
)

// diskMetrics are the disk k checkpoints took: in all (snapshots, checkpoint images, content),
// of it the filesystem state and the memory as stored (cklite's memory store; the memory as
// dumped beside it, and how many times smaller it is stored), and in all with cklite's dedup of
// identical files (computed; stock has none); and the last checkpoint exported as an image, with
// what of it a registry holding the one before's would be sent (cklite's export; stock has none).
func diskMetrics(k int) []metric {
	return []metric{
		{fmt.Sprintf("disk after %d ckpts", k), "MiB", func(m *measured) float64 { return mibOf(m.diskBytes) }},
		{"  of it filesystem", "MiB", func(m *measured) float64 { return mibOf(m.fsBytes) }},
		{"  of it memory (stored)", "MiB", func(m *measured) float64 { return orNaN(mibOf(m.memStored)) }},
		{"  memory (logical)", "MiB", func(m *measured) float64 { return orNaN(mibOf(m.memLogical)) }},
		{"  memory dedup ratio", "x", func(m *measured) float64 {
			if m.memStored == 0 {
				return math.NaN()
			}
			return math.Round(100*float64(m.memLogical)/float64(m.memStored)) / 100
		}},
		{"  memory stored in full dumps", "x", func(m *measured) float64 {
			if m.memLogical == 0 || len(m.checkpoint) == 0 {
				return math.NaN()
			}
			return math.Round(100*float64(m.memStored)*float64(len(m.checkpoint))/float64(m.memLogical)) / 100
		}},
		{"  in all with dedup", "MiB", func(m *measured) float64 {
			if !m.dedup {
				return math.NaN()
			}
			return mibOf(m.diskBytes - m.dedupSaved)
		}},
		{"last ckpt exported: image", "MiB", func(m *measured) float64 { return orNaN(mibOf(m.exportImage)) }},
		{"  pushed after the one before", "MiB", func(m *measured) float64 {
			if m.exportImage == 0 {
				return math.NaN()
			}
			return mibOf(m.exportPushed)
		}},
		{"disk per ckpt", "KiB", perCkpt(func(m *measured) int64 { return m.diskBytes })},
		{"  filesystem per ckpt", "KiB", perCkpt(func(m *measured) int64 { return m.fsBytes })},
		{"  memory stored per ckpt", "KiB", perCkpt(func(m *measured) int64 { return m.memStored })},
		{"  memory logical per ckpt", "KiB", perCkpt(func(m *measured) int64 { return m.memLogical })},
	}
}

// perCkpt is v over the checkpoints a system took, in KiB; NaN where v was not measured (stock's
// memory store) or no checkpoint was taken.
func perCkpt(v func(*measured) int64) func(*measured) float64 {
	return func(m *measured) float64 {
		if len(m.checkpoint) == 0 {
			return math.NaN()
		}
		return orNaN(float64(v(m)) / float64(len(m.checkpoint)) / 1024)
	}
}

// forkMetrics are the forks' times: each (p50) and all of them.
var forkMetrics = []metric{
	{"fork each p50", "ms", p50(func(m *measured) []time.Duration { return m.forkEach })},
	{"fork total", "ms", func(m *measured) float64 { return orNaN(msOf(m.forkTotal)) }},
}

// restoreMetrics count the restores (rollbacks, forks) that were made and those verified.
var restoreMetrics = []metric{
	{"restores made", "", func(m *measured) float64 { return float64(m.restores) }},
	{"restores verified", "", func(m *measured) float64 { return float64(m.verified) }},
}

// rows turns the measurements into the table's rows, per workload in the order run, each with
// its workload's failed and retried operations; a workload with failures but no measurement
// (its container never checkpointed, say) gets a row of its own.
func rows(r results, k int) []report.Row {
	var out []report.Row
	counts := r.rec.counts()
	shown := map[where]bool{}
	add := func(w, p string, by map[string]*measured, ms ...metric) {
		c := counts[where{w, p}]
		shown[where{w, p}] = true
		for _, mt := range ms {
			v := func(sys string) float64 {
				if by[sys] == nil { // left out with -systems, or failed to start
					return math.NaN()
				}
				return mt.f(by[sys])
			}
			out = append(out, report.Row{Workload: w, Param: p, Metric: mt.name, Unit: mt.unit, Cklite: v("cklite"), Stock: v("stock"),
				Failed: [2]int{c["cklite"][0], c["stock"][0]}, Retried: [2]int{c["cklite"][1], c["stock"][1]}})
		}
	}
	for _, s := range r.series {
		by := r.bySeries[s]
		add(s.workload, s.param, by,
			metric{"checkpoint p50", "ms", p50(ckpt)}, metric{"checkpoint p95", "ms", p95(ckpt)},
			metric{"downtime p50", "ms", p50(down)}, metric{"downtime p95", "ms", p95(down)},
			metric{"rollback p50", "ms", p50(roll)}, metric{"rollback p95", "ms", p95(roll)})
		add(s.workload, s.param, by, criuMetrics...)
		add(s.workload, s.param, by, diskMetrics(s.checkpoints(k))...)
		add(s.workload, s.param, by, memoryMetrics...)
		add(s.workload, s.param, by, restoreMetrics...)
	}
	if r.execs != nil {
		add(execWhere.workload, execWhere.param, r.execs, execMetrics...)
		add(execWhere.workload, execWhere.param, r.execs, memoryMetrics[0])
	}
	for _, n := range sortedKeys(r.fanout) {
		by, p := r.fanout[n], fmt.Sprintf("%d forks", n)
		add("fan-out", p, by, forkMetrics[0], forkMetrics[1],
			metric{"disk per fork", "KiB", func(m *measured) float64 { return float64(m.diskBytes) / 1024 }},
			memoryMetrics[0])
		add("fan-out", p, by, restoreMetrics...)
	}
	if r.forked != nil {
		by, p := map[string]*measured{"cklite": r.forked}, r.forkedParam
		add("fork checkpoints", p, by, forkMetrics[0], forkMetrics[1],
			metric{"checkpoint p50", "ms", p50(ckpt)}, metric{"rollback p50", "ms", p50(roll)},
			metric{"1st ckpts stored against the origin", "", func(m *measured) float64 { return float64(m.fromOrigin) }})
		add("fork checkpoints", p, by, diskMetrics(len(r.forked.checkpoint))...)
		add("fork checkpoints", p, by, restoreMetrics...)
	}
	if r.tree != nil {
		by, p := r.tree, r.treeParam
		checkpoints := 0
		for _, m := range by {
			checkpoints = max(checkpoints, len(m.checkpoint))
		}
		add("tree search", p, by,
			metric{"C/R overhead total", "ms", func(m *measured) float64 { return msOf(m.overhead()) }},
			metric{"checkpoints total", "ms", func(m *measured) float64 { return msOf(sum(m.checkpoint)) }},
			metric{"rollbacks total", "ms", func(m *measured) float64 { return msOf(sum(m.rollback)) }},
			metric{"checkpoint p50", "ms", p50(ckpt)}, metric{"rollback p50", "ms", p50(roll)},
			metric{"agent + host work total", "ms", func(m *measured) float64 { return msOf(m.work) }},
			metric{"verification total", "ms", func(m *measured) float64 { return msOf(m.verify) }})
		add("tree search", p, by, criuMetrics[0], criuMetrics[1], criuMetrics[4])
		add("tree search", p, by, diskMetrics(checkpoints)...)
		add("tree search", p, by, memoryMetrics...)
		add("tree search", p, by, restoreMetrics...)
	}
	for _, w := range r.rec.places() {
		if !shown[w] {
			add(w.workload, w.param, nil, metric{"(nothing measured)", "", nil})
		}
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
func latencyChart(title, xlabel, w string, size func(series) int, r results) report.Chart {
	c := report.Chart{Title: title, XLabel: xlabel, YLabel: "latency, p50 (ms)"}
	for _, metric := range []string{"checkpoint", "rollback"} {
		for _, sys := range systems {
			s := report.Series{Name: sys + " " + metric, Dashed: metric == "rollback"}
			for _, se := range r.series {
				if se.workload != w && se.workload != "idle" {
					continue
				}
				m := r.bySeries[se][sys]
				if m == nil {
					continue
				}
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
			if m := fanout[n][sys]; m != nil && m.forkTotal > 0 {
				s.Points = append(s.Points, report.Point{X: float64(n), Y: msOf(m.forkTotal)})
			}
		}
		c.Series = append(c.Series, s)
	}
	return c
}

// diskChart is the disk grown against the number of checkpoints taken, for the filesystem
// workload with the most data and for the tree search, on both systems.
func diskChart(r results) report.Chart {
	c := report.Chart{Title: "Disk vs number of checkpoints", XLabel: "checkpoints taken", YLabel: "disk grown (MiB)"}
	var big *series
	for i, s := range r.series {
		if s.workload == "filesystem" && (big == nil || s.rootfsMB > big.rootfsMB) {
			big = &r.series[i]
		}
	}
	add := func(name string, m *measured, dashed bool) {
		if m == nil {
			return
		}
		s := report.Series{Name: name, Dashed: dashed}
		for i, d := range m.diskAfter {
			s.Points = append(s.Points, report.Point{X: float64(i + 1), Y: mibOf(d)})
		}
		c.Series = append(c.Series, s)
	}
	for _, sys := range systems {
		if big != nil {
			add(fmt.Sprintf("%s, %d MB rootfs", sys, big.rootfsMB), r.bySeries[*big][sys], false)
		}
		if r.tree != nil {
			add(sys+", tree search", r.tree[sys], true)
		}
	}
	return c
}

// treeBars is where the tree search's time went, per system.
func treeBars(tree map[string]*measured) report.Bars {
	b := report.Bars{Title: "Tree search: where the time goes", YLabel: "seconds",
		Groups: systems, Stacks: []string{"checkpoints", "rollbacks", "agent + host work", "verification"}}
	for _, sys := range systems {
		m := tree[sys]
		if m == nil {
			m = &measured{}
		}
		b.Values = append(b.Values, []float64{sum(m.checkpoint).Seconds(), sum(m.rollback).Seconds(), m.work.Seconds(), m.verify.Seconds()})
	}
	return b
}

// svgWriter is a line chart or a bar chart.
type svgWriter interface{ SVG(io.Writer) error }

// writeResults prints the table to log and writes it as CSV and Markdown, with the charts and
// the failures, into o.out. It runs after every workload: each file is replaced whole (written
// aside, then renamed), so that a run killed at any point leaves the last complete set. The
// final call prints the table and what was written too.
func writeResults(log io.Writer, o options, r results, took time.Duration, final bool) error {
	rs := rows(r, o.checkpoints)
	if final {
		fmt.Fprintf(log, "\nResults (cklite/stock: below 1x cklite takes less time or space; failed and retried operations, cklite / stock), %s in all:\n\n", took.Round(time.Second))
		if err := report.Table(log, rs); err != nil {
			return err
		}
	}
	var csvBuf, mdBuf, failBuf bytes.Buffer
	if err := report.CSV(&csvBuf, rs); err != nil {
		return err
	}
	if err := report.Markdown(&mdBuf, rs); err != nil {
		return err
	}
	if err := writeFailures(&failBuf, r.rec); err != nil {
		return err
	}
	files := map[string][]byte{"results.csv": csvBuf.Bytes(), "results.md": mdBuf.Bytes(), "failures.csv": failBuf.Bytes()}
	charts := map[string]svgWriter{"disk-vs-checkpoints.svg": diskChart(r)}
	if len(r.series) > 0 {
		charts["latency-vs-memory.svg"] = latencyChart("Checkpoint and rollback vs memory held", "memory held (MB)", "memory", func(s series) int { return s.memMB }, r)
		charts["latency-vs-rootfs.svg"] = latencyChart("Checkpoint and rollback vs data in the rootfs", "written to the rootfs (MB)", "filesystem", func(s series) int { return s.rootfsMB }, r)
	}
	if len(r.fanout) > 0 {
		charts["fork-total-vs-n.svg"] = fanoutChart(r.fanout)
	}
	if r.tree != nil {
		charts["tree-breakdown.svg"] = treeBars(r.tree)
	}
	var names []string
	for name, c := range charts {
		var b bytes.Buffer
		if err := c.SVG(&b); err != nil {
			return err
		}
		files[name] = b.Bytes()
		names = append(names, name)
	}
	for name, data := range files {
		if err := writeAtomic(filepath.Join(o.out, name), data); err != nil {
			return err
		}
	}
	if !final {
		return nil
	}
	slices.Sort(names)
	failed, retried := r.rec.tally()
	abs, _ := filepath.Abs(o.out)
	fmt.Fprintf(log, "Written to %s: results.csv, results.md, failures.csv (%d failed, %d retried), bench.log and the charts %s\n",
		abs, failed, retried, strings.Join(names, " "))
	return nil
}

// writeFailures writes every failed or retried operation as CSV: which system, workload and
// step, the error that remained ("" when the retry succeeded) and the transient error that was
// retried ("" without a retry).
func writeFailures(w io.Writer, rec *recorder) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"system", "workload", "param", "step", "error", "retried_after"})
	text := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}
	for _, f := range rec.all {
		_ = cw.Write([]string{f.system, f.workload, f.param, f.step, text(f.err), text(f.retried)})
	}
	cw.Flush()
	return cw.Error()
}

// writeAtomic replaces name with data: a reader, or a run killed meanwhile, sees the old file or
// the new one, never half of one.
func writeAtomic(name string, data []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}
