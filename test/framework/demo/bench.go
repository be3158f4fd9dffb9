package demo

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/druid-stretch/druid-stretch/test/framework/report"
)

// BenchCase is one run of the benchmark.
type BenchCase struct {
	RTT         time.Duration
	PreloadKeys int
	// Run numbers the repeated runs of one RTT and preload from 1; 0 when
	// the bench runs each once.
	Run int
}

// dirName is the case's folder under the bench's --dir.
func (c BenchCase) dirName() string {
	if c.Run > 0 {
		return fmt.Sprintf("rtt-%s-keys-%d-run-%d", c.RTT, c.PreloadKeys, c.Run)
	}
	return fmt.Sprintf("rtt-%s-keys-%d", c.RTT, c.PreloadKeys)
}

// label names the case in progress lines and headings.
func (c BenchCase) label() string {
	l := fmt.Sprintf("RTT %s, %d keys", c.RTT, c.PreloadKeys)
	if c.Run > 0 {
		l += fmt.Sprintf(", run %d", c.Run)
	}
	return l
}

// RepeatedCases are the runs of every RTT and preload, RTT by RTT, each
// runs times in a row, numbered when runs is above 1.
func RepeatedCases(rtts []time.Duration, keys []int, runs int) []BenchCase {
	var out []BenchCase
	for _, rtt := range rtts {
		for _, k := range keys {
			for i := 1; i <= max(runs, 1); i++ {
				c := BenchCase{RTT: rtt, PreloadKeys: k}
				if runs > 1 {
					c.Run = i
				}
				out = append(out, c)
			}
		}
	}
	return out
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
			// its sites' logs afterwards, and the moment of its longest
			// write gap in its report and plot.
			o.Dir = filepath.Join(base.Dir, c.dirName())
			o.ReportPath, o.PlotPath = filepath.Join(o.Dir, "report.json"), filepath.Join(o.Dir, "plot.svg")
		}
		start := time.Now()
		_, _ = fmt.Fprintf(progress, "bench: %s ...", c.label())
		rep, err := RunOnSites(ctx, o)
		if err != nil {
			_, _ = fmt.Fprintln(progress, " failed")
			return out, fmt.Errorf("bench case %s: %w", c.label(), err)
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
	_, _ = fmt.Fprintln(tw, "RTT\tkeys\trun\tmove s\tmembership s\tbaseline s\tratio\tmembership ratio\ttie s\tno leader s\tfailed per server\tmax gap ms per server\tlost\tlinearizable\town client failed\t")
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
		run := "-"
		if r.Case.Run > 0 {
			run = fmt.Sprintf("%d", r.Case.Run)
		}
		_, _ = fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%s\t%s\t%s\t%s\t%d\t\n",
			r.Case.RTT, r.Case.PreloadKeys, run, rep.MigrationSeconds, membership, base, ratio, mratio, rep.TieSeconds, rep.NoLeaderSeconds,
			strings.Join(failed, " / "), strings.Join(gaps, " / "), lost, linearizable, rep.FailedRequests)
	}
	return tw.Flush()
}

// WriteBenchTimelines prints each case's step timeline under a heading
// naming the case: where its move's seconds went, the lines the demo's
// report prints.
func WriteBenchTimelines(w io.Writer, results []BenchResult) error {
	for _, r := range results {
		_, _ = fmt.Fprintf(w, "\n%s: steps\n", r.Case.label())
		if err := r.Report.WriteTimeline(w, "  "); err != nil {
			return err
		}
		if b := r.Report.Baseline; b != nil {
			_, _ = fmt.Fprintf(w, "%s: the hand-scripted baseline's steps\n", r.Case.label())
			if err := (report.Report{Steps: b.Steps}).WriteTimeline(w, "  "); err != nil {
				return err
			}
		}
	}
	return nil
}

// BenchSpread is how the repeated runs of one RTT and preload spread: the
// median and the worst (the longest) of the move and of its membership
// part, and the median of the baselines measured in the same runs.
type BenchSpread struct {
	RTT                               time.Duration
	PreloadKeys, Runs                 int
	MoveMedian, MoveWorst             float64
	MembershipMedian, MembershipWorst float64
	// BaselineMedian is 0 when no run measured the baseline.
	BaselineMedian float64
}

// WorstToMedian is the membership part's worst run over its median (the
// move's when no run had a membership part).
func (s BenchSpread) WorstToMedian() float64 {
	if s.MembershipMedian > 0 {
		return s.MembershipWorst / s.MembershipMedian
	}
	if s.MoveMedian > 0 {
		return s.MoveWorst / s.MoveMedian
	}
	return 0
}

// Spreads groups the results of repeated runs by RTT and preload, in the
// order of their first run; a case run once has no spread.
func Spreads(results []BenchResult) []BenchSpread {
	type key struct {
		rtt  time.Duration
		keys int
	}
	var order []key
	groups := map[key][]report.Report{}
	for _, r := range results {
		if r.Case.Run == 0 {
			continue
		}
		k := key{r.Case.RTT, r.Case.PreloadKeys}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r.Report)
	}
	var out []BenchSpread
	for _, k := range order {
		reps := groups[k]
		var moves, parts, bases []float64
		for _, rep := range reps {
			moves = append(moves, rep.MigrationSeconds)
			if rep.MembershipSeconds > 0 {
				parts = append(parts, rep.MembershipSeconds)
			}
			if rep.Baseline != nil {
				bases = append(bases, rep.Baseline.MoveSeconds)
			}
		}
		out = append(out, BenchSpread{
			RTT: k.rtt, PreloadKeys: k.keys, Runs: len(reps),
			MoveMedian: median(moves), MoveWorst: slices.Max(moves),
			MembershipMedian: median(parts), MembershipWorst: maxOrZero(parts),
			BaselineMedian: median(bases),
		})
	}
	return out
}

// WriteBenchSpreads prints one line per repeated case: the runs, the
// median and worst of the move and of its membership part, the worst
// over the median, and the membership part's median over the baselines'.
func WriteBenchSpreads(w io.Writer, spreads []BenchSpread) error {
	if len(spreads) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintln(tw, "RTT\tkeys\truns\tmove median s\tmove worst s\tmembership median s\tmembership worst s\tworst / median\tbaseline median s\tmembership median / baseline median\t")
	for _, s := range spreads {
		base, ratio := "-", "-"
		if s.BaselineMedian > 0 {
			base = fmt.Sprintf("%.1f", s.BaselineMedian)
			if s.MembershipMedian > 0 {
				ratio = fmt.Sprintf("%.2f", s.MembershipMedian/s.BaselineMedian)
			}
		}
		_, _ = fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%s\t%s\t\n",
			s.RTT, s.PreloadKeys, s.Runs, s.MoveMedian, s.MoveWorst, s.MembershipMedian, s.MembershipWorst, s.WorstToMedian(), base, ratio)
	}
	return tw.Flush()
}

// median is the middle of xs (the mean of the two middle ones for an even
// count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func maxOrZero(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Max(xs)
}
