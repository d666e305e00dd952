package report

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Bars is a stacked bar chart: one bar per group (a system), stacked from its segments in the
// order of Stacks, each stack a color of its own across the bars.
type Bars struct {
	Title, YLabel string
	Groups        []string
	Stacks        []string
	// Values[g][s] is stack s of group g.
	Values [][]float64
}

// SVG writes b as a standalone SVG document, in the line charts' frame and palette.
func (b Bars) SVG(w io.Writer) error {
	ymax := 0.0
	for _, g := range b.Values {
		t := 0.0
		for _, v := range g {
			t += v
		}
		ymax = math.Max(ymax, t)
	}
	ymax = niceCeil(ymax * 1.05)
	pw, ph := float64(width-left-right), float64(height-top-base)
	y := func(v float64) float64 { return top + ph - v/ymax*ph }
	slot := pw / float64(max(len(b.Groups), 1))

	var s strings.Builder
	writeFrame(&s, b.Title, b.YLabel, ymax)
	for g, name := range b.Groups {
		x := left + slot*float64(g) + slot*0.25
		base := 0.0
		for k, v := range b.Values[g] {
			fmt.Fprintf(&s, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				x, y(base+v), slot*0.5, y(base)-y(base+v), palette[k%len(palette)], html.EscapeString(name), html.EscapeString(b.Stacks[k]), tick(v))
			base += v
		}
		fmt.Fprintf(&s, `<text x="%.1f" y="%.1f" text-anchor="middle">%s (%s)</text>`+"\n", x+slot*0.25, top+ph+16, html.EscapeString(name), tick(math.Round(base*10)/10))
	}
	for k, name := range b.Stacks {
		ly := top + 10 + 20*k
		fmt.Fprintf(&s, `<rect x="%.1f" y="%d" width="24" height="10" fill="%s"/>`+"\n", left+pw+12, ly-5, palette[k%len(palette)])
		fmt.Fprintf(&s, `<text x="%.1f" y="%d">%s</text>`+"\n", left+pw+42, ly+4, html.EscapeString(name))
	}
	s.WriteString("</svg>\n")
	_, err := io.WriteString(w, s.String())
	return err
}
