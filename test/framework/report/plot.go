package report

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
)

var (
	answeredColor = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	failedColor   = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	stepColor     = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	phaseColor    = color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
)

// logScaleRatio: above this spread between the fastest and the slowest
// write, a linear axis squeezes the normal writes into one line at the
// bottom, so the y axis becomes logarithmic.
const logScaleRatio = 20

// checkSVGPath refuses a file name gonum would write in another format.
func checkSVGPath(path string) error {
	if ext := strings.ToLower(filepath.Ext(path)); ext != ".svg" {
		return fmt.Errorf("plot file %s: want a .svg file name, got %q", path, ext)
	}
	return nil
}

// floorMs floors latencies at 10 µs so that a log axis never meets zero.
const floorMs = 0.01

// latencyPoint is one request at its call time, its latency in ms.
func latencyPoint(at, latency time.Duration) plotter.XY {
	return plotter.XY{X: at.Seconds(), Y: math.Max(millis(latency), floorMs)}
}

// latencyPlot draws the own client's writes; title heads the colour key.
// With labelled false the marks are lines only (a panel below one that
// names them).
func latencyPlot(title string, series []workload.Sample, marks []workload.Mark, labelled bool) (*plot.Plot, error) {
	var answered, failed plotter.XYs
	yMin, yMax := math.Inf(1), 0.0
	xMax := 0.0
	for _, s := range series {
		pt := latencyPoint(s.At, s.Latency)
		if s.OK {
			answered = append(answered, pt)
		} else {
			failed = append(failed, pt)
		}
		yMin, yMax = math.Min(yMin, pt.Y), math.Max(yMax, pt.Y)
		xMax = math.Max(xMax, (s.At + s.Latency).Seconds())
	}
	for _, m := range marks {
		xMax = math.Max(xMax, m.At.Seconds())
	}

	p := plot.New()
	// The key goes into the title: a legend box would sit on the step labels.
	p.Title.Text = title + "\nblue dots: answered writes, red crosses: failed after retries, orange lines: steps, grey dashed lines: phases"
	p.Title.TextStyle.Font.Size = vg.Points(10)
	// Room between the key and the step labels that reach the plot's top.
	p.Title.Padding = vg.Points(16)
	p.X.Label.Text = "time since the workload started (s)"
	p.X.Min, p.X.Max = 0, xMax*1.02
	logY := latencyAxis(p, yMin, yMax)
	p.Add(plotter.NewGrid())
	if err := markLines(p, marks); err != nil {
		return nil, err
	}
	if len(answered) > 0 {
		sc, err := dots(thin(answered, p, logY), answeredColor)
		if err != nil {
			return nil, fmt.Errorf("answered writes: %w", err)
		}
		p.Add(sc)
	}
	if len(failed) > 0 {
		sc, err := crosses(failed)
		if err != nil {
			return nil, fmt.Errorf("failed writes: %w", err)
		}
		p.Add(sc)
	}
	if !labelled {
		return p, nil
	}
	if labels, err := markLabels(marks, p.Y.Max, p.X.Max); err != nil {
		return nil, err
	} else if labels != nil {
		p.Add(labels)
	}
	return p, nil
}

// latencyAxis sets p's y axis for latencies from yMin to yMax ms, with head
// room for the step labels, and tells whether it is logarithmic.
func latencyAxis(p *plot.Plot, yMin, yMax float64) (logY bool) {
	if math.IsInf(yMin, 1) {
		yMin, yMax = 1, 10 // nothing to draw: any axis will do
	}
	if yMax <= yMin {
		yMax = yMin * 2
	}
	p.Y.Label.Text = "write latency (ms)"
	logY = yMax/yMin > logScaleRatio
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(yMin)))
		// Head room above the slowest write for the step labels (about a
		// decade and a half at this size).
		p.Y.Max = yMax * math.Pow(10, 1.5)
	} else {
		p.Y.Min, p.Y.Max = 0, yMax*1.6
	}
	return logY
}

// markLines draws a vertical line per mark across p's y axis: steps solid
// orange, phase starts dashed grey.
func markLines(p *plot.Plot, marks []workload.Mark) error {
	for _, m := range marks {
		x := m.At.Seconds()
		line, err := plotter.NewLine(plotter.XYs{{X: x, Y: p.Y.Min}, {X: x, Y: p.Y.Max}})
		if err != nil {
			return fmt.Errorf("marker %q: %w", m.Name, err)
		}
		line.Color = stepColor
		line.Width = vg.Points(1)
		if m.Phase {
			line.Color = phaseColor
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(line)
	}
	return nil
}

// dots are answered requests; crosses, in red, failed ones.
func dots(pts plotter.XYs, c color.Color) (*plotter.Scatter, error) {
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return nil, err
	}
	sc.GlyphStyle = draw.GlyphStyle{Color: c, Radius: vg.Points(1.2), Shape: draw.CircleGlyph{}}
	return sc, nil
}

func crosses(pts plotter.XYs) (*plotter.Scatter, error) {
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return nil, err
	}
	sc.GlyphStyle = draw.GlyphStyle{Color: failedColor, Radius: vg.Points(3), Shape: draw.CrossGlyph{}}
	return sc, nil
}

// thinGrid is the resolution, in cells per axis, below which two dots are
// drawn as one: they would cover each other at the plot's size anyway, and
// a run of tens of thousands of writes stays a small SVG.
const thinGrid = 300

// thin keeps one point per cell of a thinGrid x thinGrid grid over the
// plot's axes (log-spaced on a log axis), in order.
func thin(pts plotter.XYs, p *plot.Plot, logY bool) plotter.XYs {
	cell := func(v, lo, hi float64, log bool) int {
		if log {
			v, lo, hi = math.Log10(v), math.Log10(lo), math.Log10(hi)
		}
		return int((v - lo) / (hi - lo) * thinGrid)
	}
	seen := map[[2]int]bool{}
	out := make(plotter.XYs, 0, len(pts))
	for _, pt := range pts {
		k := [2]int{cell(pt.X, p.X.Min, p.X.Max, false), cell(pt.Y, p.Y.Min, p.Y.Max, logY)}
		if !seen[k] {
			seen[k] = true
			out = append(out, pt)
		}
	}
	return out
}

// labelGap is the fraction of the time axis within which marks share one
// label: vertical labels closer than that would overprint each other.
const labelGap = 0.015

// markLabels writes the marks' names vertically along their lines, hanging
// from the top of the plot; marks close in time share one label, their
// names joined, at the first one's line.
func markLabels(marks []workload.Mark, top, xMax float64) (*plotter.Labels, error) {
	if len(marks) == 0 {
		return nil, nil
	}
	xyl := plotter.XYLabels{}
	var phase []bool
	groupStart := math.Inf(-1)
	for _, m := range marks {
		x := m.At.Seconds()
		if n := len(xyl.Labels); n > 0 && x-groupStart < labelGap*xMax {
			xyl.Labels[n-1] = shorten(xyl.Labels[n-1] + " · " + m.Name)
			phase[n-1] = phase[n-1] && m.Phase
			continue
		}
		groupStart = x
		xyl.XYs = append(xyl.XYs, plotter.XY{X: x, Y: top})
		xyl.Labels = append(xyl.Labels, shorten(m.Name))
		phase = append(phase, m.Phase)
	}
	labels, err := plotter.NewLabels(xyl)
	if err != nil {
		return nil, fmt.Errorf("marker labels: %w", err)
	}
	for i := range xyl.Labels {
		st := labels.TextStyle[i]
		st.Rotation = math.Pi / 2
		st.XAlign = text.XRight
		st.YAlign = text.YBottom
		st.Font.Size = vg.Points(8)
		st.Color = stepColor
		if phase[i] {
			st.Color = phaseColor
		}
		labels.TextStyle[i] = st
	}
	labels.Offset = vg.Point{X: -vg.Points(2), Y: -vg.Points(3)}
	return labels, nil
}

// maxLabel is the longest mark label, in characters. gonum reserves a
// label's length as head room above the data (it does not rotate the glyph
// box), so a longer one squeezes a panel's data area to nothing.
const maxLabel = 48

// shorten cuts a label to maxLabel characters, marking the cut.
func shorten(label string) string {
	if r := []rune(label); len(r) > maxLabel {
		return string(r[:maxLabel-1]) + "…"
	}
	return label
}

// Markers converts steps on the run's clock into plot marks, for callers
// that hold a Report rather than the workload's marks.
func Markers(steps []Step) []workload.Mark {
	marks := make([]workload.Mark, 0, len(steps))
	for _, s := range steps {
		marks = append(marks, workload.Mark{At: time.Duration(s.AtSeconds * float64(time.Second)), Name: s.Name})
	}
	return marks
}
