package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
)

// apiRequests are the requests behind apiResults: writes every 100 ms
// through site-a until its clients move to site-b at 58 s, a stall at 40 s,
// two writes failed by a member removal and one read timed out.
func apiRequests() []apiload.Request {
	var reqs []apiload.Request
	for at := time.Second; at < 80*time.Second; at += 100 * time.Millisecond {
		server, origin := "site-a", ""
		if at >= 58*time.Second {
			server, origin = "site-b", "site-a"
		}
		lat := msec(4)
		if at >= 40*time.Second && at < 41*time.Second {
			lat = msec(1100)
		}
		reqs = append(reqs, apiload.Request{
			Server: server, Origin: origin, Kind: workload.Write, Object: "move/cm-1",
			Call: at, Return: at + lat, Code: 200, Outcome: workload.Succeeded,
		})
	}
	failed := func(kind workload.Kind, at, lat time.Duration, class apiload.FailureClass, err string) apiload.Request {
		return apiload.Request{
			Server: "site-a", Kind: kind, Object: "move/cm-2", Call: at, Return: at + lat,
			Code: 500, Outcome: workload.Failed, Class: class, Err: err,
		}
	}
	return append(reqs,
		failed(workload.Write, msec(40200), msec(30), apiload.MemberRemoved, "etcdserver: server stopped"),
		failed(workload.Write, msec(40300), msec(25), apiload.MemberRemoved, "etcdserver: server stopped"),
		failed(workload.Read, msec(45000), 30*time.Second, apiload.Timeout, "the server was unable to return a response in the time allotted"),
	)
}

func TestPlotRunSVG(t *testing.T) {
	res := apiResults()
	r := FromFigures(figures())
	offset := res.StartedAt.Sub(r.StartedAt)
	marks := figures().Marks
	var own []workload.Sample
	for at := time.Duration(0); at < 40*time.Second; at += 50 * time.Millisecond {
		own = append(own, workload.Sample{At: at, Latency: msec(3), OK: true})
	}
	tests := []struct {
		name string
		in   RunPlot
		// want are texts the plot shows, beyond the servers' names and
		// the step labels.
		want, notWant []string
	}{
		{
			name: "kube-apiservers and the own client",
			in:   RunPlot{Requests: apiRequests(), Servers: res.Servers, Offset: offset, Own: own, Marks: marks},
			want: []string{
				"site-a (blue dots): 3 failed, max gap 1.21 s", "site-b (green dots): 0 failed, max gap 120 ms",
				"(2 MemberRemoved, 1 Timeout)", "clients to site-b",
				ownClientLabel + ": write latency over time", "time since the run started (s)",
			},
		},
		{
			name:    "kube-apiservers only",
			in:      RunPlot{Requests: apiRequests(), Servers: res.Servers, Offset: offset, Marks: marks},
			want:    []string{"/readyz per kube-apiserver", "write latency (ms)"},
			notWant: []string{"own etcd client"},
		},
		{
			name: "servers without requests yet",
			in:   RunPlot{Servers: []apiload.ServerFigures{{Name: "site-a"}, {Name: "site-b"}}, Marks: marks},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			path := filepath.Join(t.TempDir(), "run.svg")
			g.Expect(PlotRunSVG(path, tt.in)).To(Succeed())
			root, text := svgText(g, path)
			g.Expect(root).To(Equal("svg"))
			for _, f := range tt.in.Servers {
				g.Expect(text).To(ContainSubstring(f.Name))
			}
			for _, m := range marks {
				g.Expect(text).To(ContainSubstring(m.Name))
			}
			for _, w := range tt.want {
				g.Expect(text).To(ContainSubstring(w))
			}
			for _, w := range tt.notWant {
				g.Expect(text).NotTo(ContainSubstring(w))
			}
		})
	}

	t.Run("bad input", func(t *testing.T) {
		g := NewWithT(t)
		dir := t.TempDir()
		in := RunPlot{Requests: apiRequests(), Servers: res.Servers}
		g.Expect(PlotRunSVG(filepath.Join(dir, "run.png"), in)).To(MatchError(ContainSubstring(`want a .svg file name, got ".png"`)))
		g.Expect(PlotRunSVG(filepath.Join(dir, "run"), in)).To(MatchError(ContainSubstring(`want a .svg file name, got ""`)))
		g.Expect(PlotRunSVG(filepath.Join(dir, "run.svg"), RunPlot{Requests: apiRequests()})).To(MatchError(ContainSubstring("no kube-apiservers")))
		entries, err := os.ReadDir(dir)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(entries).To(BeEmpty(), "a refused plot writes no file")
		g.Expect(PlotRunSVG(filepath.Join(dir, "no", "such", "dir.svg"), in)).To(MatchError(ContainSubstring("writing plot")))
	})
}

func TestReadyBands(t *testing.T) {
	g := NewWithT(t)
	series := []apiload.ReadyzSample{
		{At: msec(0), Code: 0}, {At: msec(1000), Code: 200}, {At: msec(2000), Code: 200},
		{At: msec(3000), Code: 500}, {At: msec(4000), Code: 200},
	}
	g.Expect(readyBands(series, time.Second)).To(Equal([]Window{
		{FromSeconds: 2, ToSeconds: 4}, // until the probe that said 500
		{FromSeconds: 5, ToSeconds: 6}, // the last answer counts one interval
	}))
	g.Expect(readyBands([]apiload.ReadyzSample{{At: msec(0), Code: 200}, {At: msec(1000), Code: 200}, {At: msec(50000), Code: 200}}, 0)).
		To(Equal([]Window{{FromSeconds: 0, ToSeconds: 51}}), "one long gap does not stretch the last answer")
	g.Expect(readyBands(nil, 0)).To(BeEmpty())
}

// TestLongStepLabelsLeaveEveryPanelItsData: gonum reserves a vertical
// label's length as head room, so marks named at length (several close
// steps share one label) once squeezed the own client's panel, which
// repeated the labels, to a negative height: it drew nothing.
func TestLongStepLabelsLeaveEveryPanelItsData(t *testing.T) {
	g := NewWithT(t)
	var own []workload.Sample
	for at := time.Duration(0); at < 200*time.Second; at += 50 * time.Millisecond {
		own = append(own, workload.Sample{At: at, Latency: msec(3 + int(at/time.Second)%40), OK: true})
	}
	var marks []workload.Mark
	for i, name := range []string{"prepare-source", "prepare-source done", "join-destination", "etcd: add learner (unnamed)", "etcd: promote etcd-main-4 + remove etcd-main-1"} {
		marks = append(marks, workload.Mark{At: 5*time.Second + time.Duration(i)*100*time.Millisecond, Name: name})
	}
	in := RunPlot{Requests: apiRequests(), Servers: apiResults().Servers, Own: own, Marks: marks}
	panels, heights, err := runPanels(in)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(panels).To(HaveLen(3))
	tiles := stackTiles(draw.New(vgsvg.New(plotWidth, stackHeight(heights))), heights)
	for i, p := range panels {
		d := p.DataCanvas(tiles[i])
		g.Expect(d.Max.Y-d.Min.Y).To(BeNumerically(">", heights[i]/3), "panel %d (%s) keeps most of its height for data", i, p.Title.Text)
	}
	g.Expect(shorten(strings.Repeat("x", 200))).To(HaveLen(maxLabel-1+len("…")), "a label is cut to maxLabel characters")
	g.Expect(shorten("retire-source")).To(Equal("retire-source"))
}
