package report

import (
	"math"
	"strings"
	"testing"
)

// A point whose every operation failed is NaN; the chart leaves it out rather than drawing (and
// scaling every other point by) NaN.
func TestSVGLeavesOutUnmeasuredPoints(t *testing.T) {
	for _, pts := range [][]Point{
		{{X: 0, Y: 100}, {X: 256, Y: math.NaN()}},
		{{X: 0, Y: math.NaN()}},
	} {
		var b strings.Builder
		c := Chart{Title: "t", Series: []Series{{Name: "cklite checkpoint", Points: pts}, {Name: "stock checkpoint", Points: []Point{{X: 200, Y: 50}}}}}
		if err := c.SVG(&b); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(b.String(), "NaN") {
			t.Errorf("points %v: the chart holds NaN:\n%s", pts, b.String())
		}
	}
}
