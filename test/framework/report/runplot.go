package report

import (
	"cmp"
	"errors"
	"fmt"
	"image/color"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
)

// RunPlot is what PlotRunSVG draws. Times are on the plot's clock, which
// should be the report's (so that Markers(r.Steps) fits): Offset and
// OwnOffset move the load's and the workload's clocks onto it.
type RunPlot struct {
	// Requests are the kube-apiservers' requests (apiload.Load.Requests).
	Requests []apiload.Request
	// Servers are the kube-apiservers' figures (apiload.Results.Servers):
	// their order sets the colours and rows, their Readyz series, switch,
	// failed count and max write gap are drawn. A request of a server not
	// listed still gets a colour.
	Servers []apiload.ServerFigures
	// Offset is added to every time of the load, like the offset of
	// AddKubeAPIServers.
	Offset time.Duration
	// Own are the own etcd client's writes (workload.Figures.Series);
	// without them there is no panel for that client. OwnOffset is added
	// to their times, like the offset of AddOwnClient.
	Own       []workload.Sample
	OwnOffset time.Duration
	// Marks are the steps and phases, drawn as vertical lines on every
	// panel and labelled on the first.
	Marks []workload.Mark
}

// serverColors are the servers' colours, named for the key in the title;
// red, orange and grey are taken by failures, steps and phases.
var serverColors = []struct {
	name  string
	color color.RGBA
}{
	{"blue", answeredColor},
	{"green", color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}},
	{"purple", color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}},
	{"brown", color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}},
	{"pink", color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff}},
	{"olive", color.RGBA{R: 0xbc, G: 0xbd, B: 0x22, A: 0xff}},
	{"cyan", color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}},
}

var probedColor = color.RGBA{R: 0xc7, G: 0xc7, B: 0xc7, A: 0xff}

const (
	plotWidth   = 12 * vg.Inch
	latencyH    = 6 * vg.Inch
	ownLatencyH = 4.5 * vg.Inch
	// The readiness panel grows with the servers, one row each.
	readyzBaseH   = 1.4 * vg.Inch
	readyzServerH = 0.45 * vg.Inch
	// panelGap keeps a panel's title off the tick labels above it;
	// rightMargin keeps labels near the end of the run on the page.
	panelGap    = 0.3 * vg.Inch
	rightMargin = 0.2 * vg.Inch
)

// PlotRunSVG draws a run into an SVG file at path, panels stacked on one
// time axis: the kube-apiservers' write latency (one colour per server, red
// crosses for failed requests, the steps labelled), their /readyz over
// time, and, when given, the own etcd client's write latency.
func PlotRunSVG(path string, in RunPlot) error {
	if err := checkSVGPath(path); err != nil {
		return err
	}
	panels, heights, err := runPanels(in)
	if err != nil {
		return err
	}
	c := vgsvg.New(plotWidth, stackHeight(heights))
	drawStacked(draw.New(c), panels, heights)
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing plot %s: %w", path, err)
	}
	_, err = c.WriteTo(f)
	if err = errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("writing plot %s: %w", path, err)
	}
	return nil
}

// runPanels builds PlotRunSVG's panels, top to bottom, on one time axis,
// and their heights.
func runPanels(in RunPlot) ([]*plot.Plot, []vg.Length, error) {
	if len(in.Servers) == 0 {
		return nil, nil, errors.New("no kube-apiservers to plot")
	}
	names := serverNames(in)
	xMin, xMax := in.timeSpan()
	api, err := apiLatencyPlot(in, names, xMin, xMax)
	if err != nil {
		return nil, nil, err
	}
	ready, err := readyzPlot(in, xMax-xMin)
	if err != nil {
		return nil, nil, err
	}
	panels := []*plot.Plot{api, ready}
	heights := []vg.Length{latencyH, readyzBaseH + vg.Length(len(in.Servers))*readyzServerH}
	if len(in.Own) > 0 {
		own := make([]workload.Sample, 0, len(in.Own))
		for _, s := range in.Own {
			own = append(own, workload.Sample{At: s.At + in.OwnOffset, Latency: s.Latency, OK: s.OK})
		}
		p, err := latencyPlot(ownClientLabel+": write latency over time", own, in.Marks, false)
		if err != nil {
			return nil, nil, err
		}
		panels, heights = append(panels, p), append(heights, ownLatencyH)
	}
	for i, p := range panels {
		p.X.Min, p.X.Max = xMin, xMax
		p.X.Label.Text = ""
		if i == len(panels)-1 {
			p.X.Label.Text = "time since the run started (s)"
		}
	}
	return panels, heights, nil
}

// serverNames are the listed servers, then any other a request names.
func serverNames(in RunPlot) []string {
	var names []string
	for _, f := range in.Servers {
		names = append(names, f.Name)
	}
	for _, r := range in.Requests {
		if !slices.Contains(names, r.Server) {
			names = append(names, r.Server)
		}
	}
	return names
}

func serverColor(i int) color.RGBA { return serverColors[i%len(serverColors)].color }

// timeSpan is the shared time axis: from the run's start (or earlier, for
// a load that began before it) to its last event, with a margin.
func (in RunPlot) timeSpan() (lo, hi float64) {
	see := func(d time.Duration) { lo, hi = math.Min(lo, d.Seconds()), math.Max(hi, d.Seconds()) }
	for _, r := range in.Requests {
		see(r.Call + in.Offset)
		see(r.Return + in.Offset)
	}
	for _, f := range in.Servers {
		for _, s := range f.Readyz {
			see(s.At + in.Offset)
		}
	}
	for _, s := range in.Own {
		see(s.At + in.OwnOffset + s.Latency)
	}
	for _, m := range in.Marks {
		see(m.At)
	}
	if hi <= lo {
		hi = lo + 1
	}
	return lo, hi + 0.02*(hi-lo)
}

// apiLatencyPlot draws the answered writes of each server at their call
// time, and every failed request, write or read, as a red cross.
func apiLatencyPlot(in RunPlot, names []string, xMin, xMax float64) (*plot.Plot, error) {
	answered := make([]plotter.XYs, len(names))
	var failed plotter.XYs
	classes := map[apiload.FailureClass]int{}
	yMin, yMax := math.Inf(1), 0.0
	for _, r := range in.Requests {
		pt := latencyPoint(r.Call+in.Offset, r.Latency())
		switch {
		case r.Failed():
			failed = append(failed, pt)
			classes[r.Class]++
		case r.Kind == workload.Write:
			i := slices.Index(names, r.Server)
			answered[i] = append(answered[i], pt)
		default:
			continue // answered reads would bury the writes
		}
		yMin, yMax = math.Min(yMin, pt.Y), math.Max(yMax, pt.Y)
	}

	p := plot.New()
	keys := make([]string, 0, len(in.Servers))
	for i, f := range in.Servers {
		keys = append(keys, fmt.Sprintf("%s (%s dots): %d failed, max gap %s", f.Name, serverColors[i%len(serverColors)].name, f.Failed, ms(millis(f.MaxWriteGap))))
	}
	p.Title.Text = "kube-apiserver clients (client-go, no retries of ours): write latency over time\n" +
		strings.Join(keys, " · ") + "\n" +
		"red crosses: failed requests at their call" + failedClasses(classes) + ", orange lines: steps, grey dashed lines: phases"
	p.Title.TextStyle.Font.Size = vg.Points(10)
	p.Title.Padding = vg.Points(16)
	p.X.Min, p.X.Max = xMin, xMax
	logY := latencyAxis(p, yMin, yMax)
	p.Add(plotter.NewGrid())
	if err := markLines(p, in.Marks); err != nil {
		return nil, err
	}
	for i, pts := range answered {
		if len(pts) == 0 {
			continue
		}
		sc, err := dots(thin(pts, p, logY), serverColor(i))
		if err != nil {
			return nil, fmt.Errorf("writes through %s: %w", names[i], err)
		}
		p.Add(sc)
	}
	if len(failed) > 0 {
		sc, err := crosses(failed)
		if err != nil {
			return nil, fmt.Errorf("failed requests: %w", err)
		}
		p.Add(sc)
	}
	if labels, err := markLabels(in.Marks, p.Y.Max, p.X.Max); err != nil {
		return nil, err
	} else if labels != nil {
		p.Add(labels)
	}
	return p, nil
}

// failedClasses is " (2 MemberRemoved, 1 Timeout)", most frequent first,
// or "" without failures.
func failedClasses(classes map[apiload.FailureClass]int) string {
	if len(classes) == 0 {
		return ""
	}
	keys := make([]apiload.FailureClass, 0, len(classes))
	for c := range classes {
		keys = append(keys, c)
	}
	slices.SortFunc(keys, func(a, b apiload.FailureClass) int {
		return cmp.Or(classes[b]-classes[a], strings.Compare(string(a), string(b)))
	})
	parts := make([]string, 0, len(keys))
	for _, c := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", classes[c], cmp.Or(string(c), "unclassified")))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// Line widths of the readiness panel: a band where /readyz said 200, a
// thin line where it was probed and did not.
const (
	readyWidth   = 7
	probedWidth  = 1.5
	failingWidth = 3
)

// readyzPlot draws one row per server, the first on top: a band in the
// server's colour from each 200 answer to the next probe, a thin grey line
// over the probed span, red where requests failed while it said 200, and a
// triangle where its clients were switched away. span is the time axis'
// length, for a minimum visible width.
func readyzPlot(in RunPlot, span float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "/readyz per kube-apiserver: coloured band where it answered 200 (until the next probe), grey where probed without 200,\n" +
		"red where its requests failed while it said 200, black triangle where its clients were switched to another server"
	p.Title.TextStyle.Font.Size = vg.Points(10)
	n := len(in.Servers)
	row := func(i int) float64 { return float64(n - 1 - i) }
	p.Y.Min, p.Y.Max = -0.6, float64(n)-0.4
	ticks := make([]plot.Tick, 0, n)
	for i, f := range in.Servers {
		ticks = append(ticks, plot.Tick{Value: row(i), Label: f.Name})
	}
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	if err := markLines(p, in.Marks); err != nil {
		return nil, err
	}
	minWidth := span / 500
	segment := func(y, from, to float64, c color.Color, width float64) error {
		to = math.Max(to, from+minWidth)
		l, err := plotter.NewLine(plotter.XYs{{X: from, Y: y}, {X: to, Y: y}})
		if err != nil {
			return err
		}
		l.Color, l.Width = c, vg.Points(width)
		p.Add(l)
		return nil
	}
	var switches plotter.XYLabels
	for i, f := range in.Servers {
		y := row(i)
		series := f.Readyz
		if len(series) > 0 {
			first, last := series[0].At+in.Offset, series[len(series)-1].At+in.Offset
			if err := segment(y, first.Seconds(), last.Seconds(), probedColor, probedWidth); err != nil {
				return nil, fmt.Errorf("/readyz of %s: %w", f.Name, err)
			}
		}
		for _, w := range readyBands(series, in.Offset) {
			if err := segment(y, w.FromSeconds, w.ToSeconds, serverColor(i), readyWidth); err != nil {
				return nil, fmt.Errorf("/readyz of %s: %w", f.Name, err)
			}
		}
		for _, w := range f.ReadyButFailingWindows {
			if err := segment(y, (w.From + in.Offset).Seconds(), (w.To + in.Offset).Seconds(), failedColor, failingWidth); err != nil {
				return nil, fmt.Errorf("failures of %s while ready: %w", f.Name, err)
			}
		}
		if f.SwitchedTo != "" {
			switches.XYs = append(switches.XYs, plotter.XY{X: (f.SwitchedAt + in.Offset).Seconds(), Y: y})
			switches.Labels = append(switches.Labels, "clients to "+f.SwitchedTo)
		}
	}
	if len(switches.XYs) > 0 {
		sc, err := plotter.NewScatter(switches)
		if err != nil {
			return nil, fmt.Errorf("switches: %w", err)
		}
		sc.GlyphStyle = draw.GlyphStyle{Color: color.Black, Radius: vg.Points(4), Shape: draw.TriangleGlyph{}}
		labels, err := plotter.NewLabels(switches)
		if err != nil {
			return nil, fmt.Errorf("switch labels: %w", err)
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i].Font.Size = vg.Points(8)
			labels.TextStyle[i].YAlign = text.YBottom
		}
		labels.Offset = vg.Point{X: vg.Points(5), Y: vg.Points(5)}
		p.Add(sc, labels)
	}
	return p, nil
}

// readyBands are the stretches from each 200 answer to the next probe,
// merged; the last answer counts for one typical probe interval.
func readyBands(series []apiload.ReadyzSample, offset time.Duration) []Window {
	var gaps []time.Duration
	for i := 1; i < len(series); i++ {
		gaps = append(gaps, series[i].At-series[i-1].At)
	}
	var interval time.Duration
	if len(gaps) > 0 {
		slices.Sort(gaps)
		// The lower median: a pause in the probes does not stretch it.
		interval = gaps[(len(gaps)-1)/2]
	}
	var out []Window
	for i, s := range series {
		if s.Code != http.StatusOK {
			continue
		}
		end := s.At + interval
		if i+1 < len(series) {
			end = series[i+1].At
		}
		from, to := (s.At + offset).Seconds(), (end + offset).Seconds()
		if n := len(out); n > 0 && out[n-1].ToSeconds >= from {
			out[n-1].ToSeconds = to
			continue
		}
		out = append(out, Window{FromSeconds: from, ToSeconds: to})
	}
	return out
}

// stackHeight is the height of panels stacked panelGap apart.
func stackHeight(heights []vg.Length) vg.Length {
	total := vg.Length(len(heights)-1) * panelGap
	for _, h := range heights {
		total += h
	}
	return total
}

// drawStacked draws the plots top to bottom in c, each as high as heights
// says and panelGap apart, their data areas aligned left and right so that
// one instant is one x on every panel (plot.Align does this for equal
// tiles only).
func drawStacked(c draw.Canvas, plots []*plot.Plot, heights []vg.Length) {
	tiles := stackTiles(c, heights)
	var left, right vg.Length
	for i, p := range plots {
		d := p.DataCanvas(tiles[i])
		left, right = max(left, d.Min.X-tiles[i].Min.X), max(right, tiles[i].Max.X-d.Max.X)
	}
	for i, p := range plots {
		d := p.DataCanvas(tiles[i])
		tiles[i].Min.X += left - (d.Min.X - tiles[i].Min.X)
		tiles[i].Max.X -= right - (tiles[i].Max.X - d.Max.X)
		p.Draw(tiles[i])
	}
}

// stackTiles divides c into panels top to bottom, as high as heights says
// and panelGap apart, leaving rightMargin free on the right.
func stackTiles(c draw.Canvas, heights []vg.Length) []draw.Canvas {
	c = draw.Crop(c, 0, -rightMargin, 0, 0)
	tiles := make([]draw.Canvas, len(heights))
	top := c.Max.Y
	for i, h := range heights {
		tiles[i] = draw.Canvas{Canvas: c.Canvas, Rectangle: vg.Rectangle{
			Min: vg.Point{X: c.Min.X, Y: top - h},
			Max: vg.Point{X: c.Max.X, Y: top},
		}}
		top -= h + panelGap
	}
	return tiles
}
