package report

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
)

// Chart is a line chart: each series a polyline with a marker at every point.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
}

type Series struct {
	Name   string
	Dashed bool
	Points []Point
}

type Point struct{ X, Y float64 }

// palette: a color per series, in order; cklite's series come first by convention.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}

const (
	width, height          = 640, 400
	left, right, top, base = 70, 170, 40, 50 // margins: the legend sits on the right
)

// SVG writes c as a standalone SVG document: written by hand so that the benchmark needs no
// plotting library, and readable in any browser.
func (c Chart) SVG(w io.Writer) error {
	c.Series = slices.Clone(c.Series)
	for i := range c.Series {
		// A point not measured (NaN, as in Row: every operation of it failed) is not drawn.
		c.Series[i].Points = slices.DeleteFunc(slices.Clone(c.Series[i].Points), func(p Point) bool { return math.IsNaN(p.X) || math.IsNaN(p.Y) })
	}
	xmax, ymax := 0.0, 0.0
	for _, s := range c.Series {
		for _, p := range s.Points {
			xmax, ymax = math.Max(xmax, p.X), math.Max(ymax, p.Y)
		}
	}
	xmax, ymax = niceCeil(xmax), niceCeil(ymax*1.05)
	pw, ph := float64(width-left-right), float64(height-top-base)
	x := func(v float64) float64 { return left + v/xmax*pw }
	y := func(v float64) float64 { return top + ph - v/ymax*ph }

	var b strings.Builder
	writeFrame(&b, c.Title, c.YLabel, ymax)
	// X ticks: five steps.
	for i := 0; i <= 5; i++ {
		xv := xmax * float64(i) / 5
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(xv), top+ph+16, tick(xv))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", left+pw/2, height-12, html.EscapeString(c.XLabel))
	for i, s := range c.Series {
		color := palette[i%len(palette)]
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for _, p := range s.Points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.X), y(p.Y)))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), color, dash)
		for _, p := range s.Points {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s: %s, %s</title></circle>`+"\n", x(p.X), y(p.Y), color, html.EscapeString(s.Name), tick(p.X), tick(p.Y))
		}
		ly := top + 10 + 20*i
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", left+pw+12, left+pw+36, ly, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`+"\n", left+pw+42, ly+4, html.EscapeString(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// writeFrame opens an SVG document of the charts' size and writes its title, the plot area's
// frame, horizontal grid lines with y ticks in five steps up to ymax, and the y label.
func writeFrame(b *strings.Builder, title, ylabel string, ymax float64) {
	pw, ph := float64(width-left-right), float64(height-top-base)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	for i := 0; i <= 5; i++ {
		yv := ymax * float64(i) / 5
		yp := top + ph - yv/ymax*ph
		fmt.Fprintf(b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, left+pw, yp, yp)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, yp+4, tick(yv))
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", top+ph/2, html.EscapeString(ylabel))
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, so that the ticks are round numbers.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func tick(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}
