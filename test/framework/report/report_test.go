package report

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
)

func msec(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func figures() workload.Figures {
	return workload.Figures{
		StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Duration:  42 * time.Second,
		Writes:    4000, WriteConflicts: 120, Reads: 800,
		FailedWrites: 1, FailedReads: 0, FailedRequests: 1, Retries: 17,
		FailedErrors:           []workload.ErrorCount{{Message: "etcdserver: request timed out", Count: 1}},
		LostAcknowledgedWrites: 0, Linearizable: true, LinearizabilityResult: "Ok",
		MaxWriteGap: msec(1210), MaxWriteGapAt: msec(20500),
		WriteLatency: workload.Latency{Count: 4120, P50: msec(3), P99: msec(190), Max: msec(1200)},
		Phases: []workload.PhaseFigures{
			{Name: "before", Start: 0, End: msec(10000), Writes: 1000, WriteLatency: workload.Latency{P50: msec(2), P99: msec(4)}, MaxWriteGap: msec(12)},
			{Name: "during", Start: msec(10000), End: msec(30000), Writes: 2000, Failed: 1, WriteLatency: workload.Latency{P50: msec(180), P99: msec(400)}, MaxWriteGap: msec(1210)},
			{Name: "after", Start: msec(30000), End: msec(42000), Writes: 1000, WriteLatency: workload.Latency{P50: msec(2), P99: msec(5)}, MaxWriteGap: msec(11)},
		},
		Marks: []workload.Mark{
			{At: 0, Name: "before", Phase: true},
			{At: msec(10000), Name: "during", Phase: true},
			{At: msec(11000), Name: "promote seed-b-etcd-main-3"},
			{At: msec(20000), Name: "move leader to seed-b-etcd-main-3"},
			{At: msec(30000), Name: "after", Phase: true},
		},
		Preload: workload.PreloadFigures{Keys: 1000, ValueSize: 1024, Duration: msec(900)},
	}
}

func TestFromFiguresWritesTheAgreedJSONKeys(t *testing.T) {
	g := NewWithT(t)
	r := FromFigures(figures())
	r.MigrationSeconds, r.TieSeconds, r.NoLeaderSeconds, r.RTTMs = 19.5, 0.82, 0.1, 180

	path := filepath.Join(t.TempDir(), "report.json")
	g.Expect(r.WriteJSON(path)).To(Succeed())
	raw, err := os.ReadFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	var doc map[string]any
	g.Expect(json.Unmarshal(raw, &doc)).To(Succeed())
	g.Expect(doc).To(HaveKeyWithValue("failedRequests", BeNumerically("==", 1)))
	g.Expect(doc).To(HaveKeyWithValue("lostAcknowledgedWrites", BeNumerically("==", 0)))
	g.Expect(doc).To(HaveKeyWithValue("linearizable", true))
	g.Expect(doc).To(HaveKeyWithValue("maxWriteGapMs", BeNumerically("==", 1210)))
	g.Expect(doc).To(HaveKeyWithValue("migrationSeconds", BeNumerically("==", 19.5)))
	g.Expect(doc).To(HaveKeyWithValue("tieSeconds", BeNumerically("==", 0.82)))
	g.Expect(doc).To(HaveKeyWithValue("noLeaderSeconds", BeNumerically("==", 0.1)))
	g.Expect(doc).To(HaveKeyWithValue("p50WriteMs", BeNumerically("==", 3)))
	g.Expect(doc).To(HaveKeyWithValue("p99WriteMs", BeNumerically("==", 190)))
	g.Expect(doc).To(HaveKeyWithValue("rttMs", BeNumerically("==", 180)))
	g.Expect(doc).To(HaveKeyWithValue("preload", HaveKeyWithValue("keys", BeNumerically("==", 1000))))
	g.Expect(doc["phases"]).To(HaveLen(3))
	g.Expect(doc["failedRequestErrors"]).To(ConsistOf(HaveKeyWithValue("message", "etcdserver: request timed out")))
	g.Expect(doc).To(HaveKeyWithValue("startedAt", "2026-01-02T03:04:05Z"))
	g.Expect(doc["steps"]).To(ConsistOf(
		And(HaveKeyWithValue("name", "promote seed-b-etcd-main-3"), HaveKeyWithValue("at", "2026-01-02T03:04:16Z")),
		And(HaveKeyWithValue("name", "move leader to seed-b-etcd-main-3"), HaveKeyWithValue("atSeconds", BeNumerically("==", 20))),
	))

	back, err := ReadJSON(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(back).To(Equal(r))
	g.Expect(back.Phases[1]).To(Equal(Phase{
		Name: "during", StartSeconds: 10, EndSeconds: 30, Writes: 2000, Failed: 1,
		P50WriteMs: 180, P99WriteMs: 400, MaxWriteGapMs: 1210,
	}))

	_, err = ReadJSON(filepath.Join(t.TempDir(), "missing.json"))
	g.Expect(err).To(MatchError(ContainSubstring("missing.json")))
	g.Expect(r.WriteJSON(filepath.Join(t.TempDir(), "no", "such", "dir.json"))).To(MatchError(ContainSubstring("writing report")))
}

func TestEmptyFiguresStillGiveListsInJSON(t *testing.T) {
	g := NewWithT(t)
	b, err := json.Marshal(FromFigures(workload.Figures{}))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(b)).To(ContainSubstring(`"phases":[]`))
	g.Expect(string(b)).To(ContainSubstring(`"steps":[]`))
	g.Expect(string(b)).NotTo(ContainSubstring(`startedAt`))
}

func TestTextRendering(t *testing.T) {
	g := NewWithT(t)
	r := FromFigures(figures())
	r.Title = "live move A -> B"
	r.MigrationSeconds, r.TieSeconds, r.NoLeaderSeconds, r.RTTMs = 19.5, 0.82, 0.1, 180
	// Columns are aligned with spaces; compare words.
	words := func(r Report) string { return strings.Join(strings.Fields(r.String()), " ") }
	text := words(r)
	for _, want := range []string{
		"live move A -> B setup 180 ms RTT, 1000 preloaded keys of 1024 bytes",
		"migration time 19.50 s time in tie 0.82 s time without leader 0.10 s",
		"failed requests 1 (after the client's retries: 1 writes, 0 reads) 1x etcdserver: request timed out",
		"lost acknowledged writes 0 linearizable yes",
		"max write gap 1.21 s (from 20.50 s)",
		"write latency p50 3.0 ms, p99 190 ms, max 1.20 s",
		"during p50 180 ms, p99 400 ms, max gap 1.21 s, 2000 writes, 1 failed (10.0-30.0 s)",
		"4000 writes acknowledged, 120 conflicts, 800 reads, 17 retries in 42.0 s",
		"steps 11.00 s promote seed-b-etcd-main-3 20.00 s move leader to seed-b-etcd-main-3",
	} {
		g.Expect(text).To(ContainSubstring(want))
	}
	g.Expect(r.String()).To(ContainSubstring("  lost acknowledged writes  0\n"), "figures share one column")

	r.Linearizable, r.LinearizabilityResult, r.FinalReadMismatches = false, "Illegal", 2
	text = words(r)
	g.Expect(text).To(ContainSubstring("linearizable NO"))
	g.Expect(text).To(ContainSubstring("2 keys end on a value other than their last acknowledged write"))
	r.LinearizabilityResult = "Unknown"
	g.Expect(words(r)).To(ContainSubstring("unknown (the check timed out)"))
}

// svgText parses an SVG file as XML and returns its root element name and
// all its character data.
func svgText(g Gomega, path string) (string, string) {
	f, err := os.Open(path)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	dec := xml.NewDecoder(f)
	var root string
	var text strings.Builder
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		g.Expect(err).NotTo(HaveOccurred(), "the plot is not well-formed XML")
		switch t := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = t.Name.Local
			}
		case xml.CharData:
			text.Write(t)
			text.WriteString("\n")
		}
	}
	return root, text.String()
}

func TestMarkersFromSteps(t *testing.T) {
	g := NewWithT(t)
	r := FromFigures(figures())
	g.Expect(Markers(r.Steps)).To(Equal([]workload.Mark{
		{At: msec(11000), Name: "promote seed-b-etcd-main-3"},
		{At: msec(20000), Name: "move leader to seed-b-etcd-main-3"},
	}))
}
