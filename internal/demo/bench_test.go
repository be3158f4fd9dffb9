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
		"RTT keys move s membership s baseline s ratio membership ratio tie s no leader s failed per server max gap ms per server lost linearizable own client failed"))
	g.Expect(strings.Fields(lines[1])).To(Equal([]string{
		"180ms", "1000", "231.1", "11.5", "23.1", "10.00", "0.50", "0.19", "0.09", "0", "/", "2", "220", "/", "874", "0", "true", "11"}))
	g.Expect(strings.Fields(lines[2])).To(Equal([]string{"0s", "100000", "100.0", "-", "-", "-", "-", "0.00", "0.00", "-", "-", "0"}),
		"a run without a baseline or kube-apiserver figures prints - for them")
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
