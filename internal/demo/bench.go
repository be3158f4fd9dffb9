package demo

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/report"
)

// BenchCase is one run of the benchmark.
type BenchCase struct {
	RTT         time.Duration
	PreloadKeys int
}

// BenchCases are the benchmark's runs: 0, 50 and 180 ms RTT, each with 1k
// and 100k preloaded keys.
func BenchCases() []BenchCase {
	var out []BenchCase
	for _, rtt := range []time.Duration{0, 50 * time.Millisecond, 180 * time.Millisecond} {
		for _, keys := range []int{1000, 100000} {
			out = append(out, BenchCase{RTT: rtt, PreloadKeys: keys})
		}
	}
	return out
}

// BenchResult is the report of one case.
type BenchResult struct {
	Case   BenchCase
	Report report.Report
}

// Bench runs the demo once per case, quietly, printing a line per case to
// progress as it goes, and returns the reports.
func Bench(ctx context.Context, cases []BenchCase, base Options, progress io.Writer) ([]BenchResult, error) {
	var out []BenchResult
	for _, c := range cases {
		o := base
		o.RTT, o.PreloadKeys, o.Quiet = c.RTT, c.PreloadKeys, true
		o.Out = io.Discard
		o.ReportPath, o.PlotPath = "", ""
		o.HeartbeatInterval, o.ElectionTimeout = 0, 0
		start := time.Now()
		fmt.Fprintf(progress, "bench: RTT %s, %d preloaded keys ...", c.RTT, c.PreloadKeys)
		rep, err := Run(ctx, o)
		if err != nil {
			fmt.Fprintln(progress, " failed")
			return out, fmt.Errorf("bench case RTT %s, %d keys: %w", c.RTT, c.PreloadKeys, err)
		}
		fmt.Fprintf(progress, " done in %.0fs\n", time.Since(start).Seconds())
		out = append(out, BenchResult{Case: c, Report: rep})
	}
	return out, nil
}

// WriteBenchTable prints the results as a table, one row per case.
func WriteBenchTable(w io.Writer, results []BenchResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "RTT\tkeys\tmove s\ttie s\tno leader s\tfailed\tlost\tlinearizable\tmax gap ms\tp50 ms\tp99 ms\tp99 before ms\tp99 during ms\tp99 after ms\t")
	for _, r := range results {
		rep := r.Report
		phase := func(name string) string {
			for _, p := range rep.Phases {
				if p.Name == name {
					return fmt.Sprintf("%.1f", p.P99WriteMs)
				}
			}
			return "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.2f\t%.2f\t%d\t%d\t%v\t%.0f\t%.1f\t%.1f\t%s\t%s\t%s\t\n",
			r.Case.RTT, r.Case.PreloadKeys, rep.MigrationSeconds, rep.TieSeconds, rep.NoLeaderSeconds, rep.FailedRequests, rep.LostAcknowledgedWrites,
			rep.Linearizable, rep.MaxWriteGapMs, rep.P50WriteMs, rep.P99WriteMs, phase("before"), phase("during"), phase("after"))
	}
	return tw.Flush()
}
