package demo

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/test/framework/report"
)

func TestWriteBenchTable(t *testing.T) {
	g := NewWithT(t)
	results := []BenchResult{{
		Case: BenchCase{RTT: 180 * time.Millisecond, PreloadKeys: 1000},
		Report: report.Report{
			MigrationSeconds: 231.1, MembershipSeconds: 11.5, TieSeconds: 0.19, NoLeaderSeconds: 0.09, FailedRequests: 11,
			KubeAPIServers: []report.APIServer{{Name: "site-a", MaxWriteGapMs: 220}, {Name: "site-b", Failed: 2, MaxWriteGapMs: 874}},
			APIHistory:     &report.APIHistory{Linearizable: true},
			Baseline:       &report.Baseline{MoveSeconds: 23.11},
		},
	}, {
		Case:   BenchCase{PreloadKeys: 100000},
		Report: report.Report{MigrationSeconds: 100},
	}}
	var b strings.Builder
	g.Expect(WriteBenchTable(&b, results)).To(Succeed())
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	g.Expect(lines).To(HaveLen(3))
	g.Expect(strings.Join(strings.Fields(lines[0]), " ")).To(Equal(
		"RTT keys run move s membership s baseline s ratio membership ratio tie s no leader s failed per server max gap ms per server lost linearizable own client failed"))
	g.Expect(strings.Fields(lines[1])).To(Equal([]string{
		"180ms", "1000", "-", "231.1", "11.5", "23.1", "10.00", "0.50", "0.19", "0.09", "0", "/", "2", "220", "/", "874", "0", "true", "11"}))
	g.Expect(strings.Fields(lines[2])).To(Equal([]string{"0s", "100000", "-", "100.0", "-", "-", "-", "-", "0.00", "0.00", "-", "-", "0"}),
		"a run without a baseline or kube-apiserver figures prints - for them")
}

func TestRepeatedCases(t *testing.T) {
	g := NewWithT(t)
	rtts, keys := []time.Duration{0, 180 * time.Millisecond}, []int{10000}
	g.Expect(RepeatedCases(rtts, keys, 1)).To(Equal([]BenchCase{{PreloadKeys: 10000}, {RTT: 180 * time.Millisecond, PreloadKeys: 10000}}),
		"run once, the cases are not numbered")
	cases := RepeatedCases(rtts, keys, 3)
	g.Expect(cases).To(HaveLen(6))
	g.Expect(cases[0]).To(Equal(BenchCase{PreloadKeys: 10000, Run: 1}))
	g.Expect(cases[2]).To(Equal(BenchCase{PreloadKeys: 10000, Run: 3}), "one case's runs follow one another")
	g.Expect(cases[3]).To(Equal(BenchCase{RTT: 180 * time.Millisecond, PreloadKeys: 10000, Run: 1}))
	g.Expect(cases[3].dirName()).To(Equal("rtt-180ms-keys-10000-run-1"), "every run keeps a folder of its own")
	g.Expect(cases[3].label()).To(Equal("RTT 180ms, 10000 keys, run 1"))
}

func TestSpreads(t *testing.T) {
	g := NewWithT(t)
	run := func(n int, move, part, base float64) BenchResult {
		return BenchResult{
			Case:   BenchCase{RTT: 180 * time.Millisecond, PreloadKeys: 10000, Run: n},
			Report: report.Report{MigrationSeconds: move, MembershipSeconds: part, Baseline: &report.Baseline{MoveSeconds: base}},
		}
	}
	results := []BenchResult{
		{Case: BenchCase{PreloadKeys: 1000}, Report: report.Report{MigrationSeconds: 50}},
		run(1, 60, 12, 18), run(2, 80, 30, 17), run(3, 62, 11, 19), run(4, 70, 14, 20),
	}
	spreads := Spreads(results)
	g.Expect(spreads).To(HaveLen(1), "a case run once has no spread")
	s := spreads[0]
	g.Expect(s.Runs).To(Equal(4))
	g.Expect(s.MoveMedian).To(Equal(66.0), "an even count's median is the mean of the middle two")
	g.Expect(s.MoveWorst).To(Equal(80.0))
	g.Expect(s.MembershipMedian).To(Equal(13.0))
	g.Expect(s.MembershipWorst).To(Equal(30.0))
	g.Expect(s.BaselineMedian).To(Equal(18.5))
	g.Expect(s.WorstToMedian()).To(BeNumerically("~", 30.0/13, 1e-9), "the membership part's spread")

	var b strings.Builder
	g.Expect(WriteBenchSpreads(&b, spreads)).To(Succeed())
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	g.Expect(lines).To(HaveLen(2))
	g.Expect(strings.Fields(lines[1])).To(Equal([]string{"180ms", "10000", "4", "66.0", "80.0", "13.0", "30.0", "2.31", "18.5", "0.70"}))

	b.Reset()
	g.Expect(WriteBenchSpreads(&b, Spreads(results[:1]))).To(Succeed())
	g.Expect(b.String()).To(BeEmpty(), "nothing repeated, no table")
}

func TestMedian(t *testing.T) {
	g := NewWithT(t)
	g.Expect(median(nil)).To(BeZero())
	g.Expect(median([]float64{3})).To(Equal(3.0))
	g.Expect(median([]float64{9, 1, 5})).To(Equal(5.0))
	in := []float64{4, 1, 3, 2}
	g.Expect(median(in)).To(Equal(2.5))
	g.Expect(in).To(Equal([]float64{4, 1, 3, 2}), "the runs keep their order")
}

func TestWriteBenchTimelines(t *testing.T) {
	g := NewWithT(t)
	results := []BenchResult{{
		Case: BenchCase{RTT: 180 * time.Millisecond, PreloadKeys: 10000},
		Report: report.Report{Steps: []report.Step{
			{Name: "join-destination", AtSeconds: 5, DurationSeconds: 22.75},
			{Name: "promote etcd-main-3", AtSeconds: 27.5},
		}, Baseline: &report.Baseline{MoveSeconds: 17.3, Steps: []report.Step{
			{Name: "promote baseline-b-0", AtSeconds: 0.74, DurationSeconds: 6.86},
		}}},
	}}
	var b strings.Builder
	g.Expect(WriteBenchTimelines(&b, results)).To(Succeed())
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	g.Expect(lines).To(HaveLen(5))
	g.Expect(lines[0]).To(Equal("RTT 180ms, 10000 keys: steps"))
	g.Expect(lines[3]).To(Equal("RTT 180ms, 10000 keys: the hand-scripted baseline's steps"))
	g.Expect(strings.Fields(lines[4])).To(Equal([]string{"0.74", "s", "promote", "baseline-b-0", "(6.86", "s)"}))
	g.Expect(strings.Fields(lines[1])).To(Equal([]string{"5.00", "s", "join-destination", "(22.75", "s)"}))
	g.Expect(strings.Fields(lines[2])).To(Equal([]string{"27.50", "s", "promote", "etcd-main-3"}))
	var demo strings.Builder
	g.Expect(results[0].Report.WriteText(&demo)).To(Succeed())
	g.Expect(demo.String()).To(ContainSubstring(lines[1]), "the demo's report prints the same timeline")
	g.Expect(demo.String()).To(ContainSubstring(lines[4]), "and the baseline's")
	g.Expect(demo.String()).To(ContainSubstring("17.30 s (the product took 0.00x)"))
}
