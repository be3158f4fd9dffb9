package demo

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/report"
)

// BenchCase is one run of the benchmark.
type BenchCase struct {
	RTT         time.Duration
	PreloadKeys int
}

// BenchCases are the benchmark's runs: 0, 50 and 180 ms RTT, each with
// 1k, 10k and 100k preloaded keys.
func BenchCases() []BenchCase {
	var out []BenchCase
	for _, rtt := range []time.Duration{0, 50 * time.Millisecond, 180 * time.Millisecond} {
		for _, keys := range []int{1000, 10000, 100000} {
			out = append(out, BenchCase{RTT: rtt, PreloadKeys: keys})
		}
	}
	return out
}

// dirName is the case's folder under the bench's --dir.
func (c BenchCase) dirName() string {
	return fmt.Sprintf("rtt-%s-keys-%d", c.RTT, c.PreloadKeys)
}

// BenchResult is the report of one case.
type BenchResult struct {
	Case   BenchCase
	Report report.Report
}

// Bench runs the demo on real sites once per case (fresh sites each time),
// quietly, printing a line per case to progress as it goes, and returns
// the reports.
func Bench(ctx context.Context, cases []BenchCase, base SiteOptions, progress io.Writer) ([]BenchResult, error) {
	var out []BenchResult
	for _, c := range cases {
		o := base
		o.RTT, o.PreloadKeys = c.RTT, c.PreloadKeys
		o.Out = io.Discard
		o.ReportPath, o.PlotPath, o.Dir = "", "", ""
		if base.Dir != "" {
			// One folder per case, kept: a slow row can be traced in
			// its sites' logs afterwards.
			o.Dir = filepath.Join(base.Dir, c.dirName())
		}
		start := time.Now()
		_, _ = fmt.Fprintf(progress, "bench: RTT %s, %d preloaded keys ...", c.RTT, c.PreloadKeys)
		rep, err := RunOnSites(ctx, o)
		if err != nil {
			_, _ = fmt.Fprintln(progress, " failed")
			return out, fmt.Errorf("bench case RTT %s, %d keys: %w", c.RTT, c.PreloadKeys, err)
		}
		_, _ = fmt.Fprintf(progress, " done in %.0fs\n", time.Since(start).Seconds())
		out = append(out, BenchResult{Case: c, Report: rep})
	}
	return out, nil
}

// WriteBenchTable prints the results as a table, one row per case: the
// move's figures (its membership part beside it, with the hand-scripted
// baseline's time and the ratios of each to it when the case ran it), then the kube-apiservers' clients' (failed requests and
// the longest write gap per server, in the report's server order; lost
// acknowledged writes and linearizability over all), then the own etcd
// client's failed requests.
func WriteBenchTable(w io.Writer, results []BenchResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintln(tw, "RTT\tkeys\tmove s\tmembership s\tbaseline s\tratio\tmembership ratio\ttie s\tno leader s\tfailed per server\tmax gap ms per server\tlost\tlinearizable\town client failed\t")
	for _, r := range results {
		rep := r.Report
		var failed, gaps []string
		for _, s := range rep.KubeAPIServers {
			failed = append(failed, fmt.Sprintf("%d", s.Failed))
			gaps = append(gaps, fmt.Sprintf("%.0f", s.MaxWriteGapMs))
		}
		lost, linearizable := "-", "-"
		if h := rep.APIHistory; h != nil {
			lost, linearizable = fmt.Sprintf("%d", h.LostAcknowledgedWrites), fmt.Sprintf("%v", h.Linearizable)
		}
		membership, base, ratio, mratio := "-", "-", "-", "-"
		if rep.MembershipSeconds > 0 {
			membership = fmt.Sprintf("%.1f", rep.MembershipSeconds)
		}
		if b := rep.Baseline; b != nil {
			base, ratio = fmt.Sprintf("%.1f", b.MoveSeconds), fmt.Sprintf("%.2f", rep.Ratio())
			if rep.MembershipSeconds > 0 {
				mratio = fmt.Sprintf("%.2f", rep.MembershipRatio())
			}
		}
		_, _ = fmt.Fprintf(tw, "%s\t%d\t%.1f\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%s\t%s\t%s\t%s\t%d\t\n",
			r.Case.RTT, r.Case.PreloadKeys, rep.MigrationSeconds, membership, base, ratio, mratio, rep.TieSeconds, rep.NoLeaderSeconds,
			strings.Join(failed, " / "), strings.Join(gaps, " / "), lost, linearizable, rep.FailedRequests)
	}
	return tw.Flush()
}

// WriteBenchTimelines prints each case's step timeline under a heading
// naming the case: where its move's seconds went, the lines the demo's
// report prints.
func WriteBenchTimelines(w io.Writer, results []BenchResult) error {
	for _, r := range results {
		_, _ = fmt.Fprintf(w, "\nRTT %s, %d keys: steps\n", r.Case.RTT, r.Case.PreloadKeys)
		if err := r.Report.WriteTimeline(w, "  "); err != nil {
			return err
		}
		if b := r.Report.Baseline; b != nil {
			_, _ = fmt.Fprintf(w, "RTT %s, %d keys: the hand-scripted baseline's steps\n", r.Case.RTT, r.Case.PreloadKeys)
			if err := (report.Report{Steps: b.Steps}).WriteTimeline(w, "  "); err != nil {
				return err
			}
		}
	}
	return nil
}
