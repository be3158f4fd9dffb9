package demo

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/report"
)

func TestWriteBenchTable(t *testing.T) {
	g := NewWithT(t)
	results := []BenchResult{{
		Case: BenchCase{RTT: 180 * time.Millisecond, PreloadKeys: 1000},
		Report: report.Report{
			MigrationSeconds: 51.1, TieSeconds: 0.22, NoLeaderSeconds: 0.09, Linearizable: true,
			MaxWriteGapMs: 1270, P50WriteMs: 4.6, P99WriteMs: 223,
			Phases: []report.Phase{{Name: "before", P99WriteMs: 25}, {Name: "during", P99WriteMs: 231}},
		},
	}}
	var b strings.Builder
	g.Expect(WriteBenchTable(&b, results)).To(Succeed())
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	g.Expect(lines).To(HaveLen(2))
	g.Expect(strings.Join(strings.Fields(lines[0]), " ")).To(Equal(
		"RTT keys move s tie s no leader s failed lost linearizable max gap ms p50 ms p99 ms p99 before ms p99 during ms p99 after ms"))
	g.Expect(strings.Fields(lines[1])).To(Equal([]string{
		"180ms", "1000", "51.1", "0.22", "0.09", "0", "0", "true", "1270", "4.6", "223.0", "25.0", "231.0", "-"}),
		"a phase the run did not have prints as -")
}
