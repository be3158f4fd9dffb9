package devcli

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
	"github.com/druid-stretch/druid-stretch/test/framework/demo"
)

// NewBenchCommand runs the demo's live move on real sites for 0, 50 and 180
// ms RTT, each with 1k, 10k and 100k preloaded keys, and prints the figures
// as a table, then each run's step timeline.
func NewBenchCommand() *cobra.Command {
	var (
		o    demo.SiteOptions
		rtts []time.Duration
		keys []int
		runs int
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run the demo's live move on real sites for several RTTs and data sizes and print the figures",
		Long: `Run the live move of the demo (two sites of real parts, a kube-apiserver per
site with client-go clients through it) once per RTT and preload, each on fresh
sites, and print one table row per run: the move's time, the time of a
hand-scripted move of the same cluster with plain clientv3 on the same sites
(--baseline) and their ratio, tie and time without
a leader, the kube-apiservers' failed requests and longest write gap per
server, lost acknowledged writes and linearizability over both, and the failed
requests of the project's own etcd client; with --runs above 1, the median and
worst of each RTT and preload's runs; then each run's step timeline, the
steps of the demo's report, so that the table's seconds can be traced. It needs
root, like the demo; each run takes 6-9 minutes on a 2-core machine.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runs < 1 {
				return fmt.Errorf("--runs %d: want 1 or more", runs)
			}
			results, err := demo.Bench(cmd.Context(), demo.RepeatedCases(rtts, keys, runs), o, cmd.ErrOrStderr())
			if len(results) > 0 {
				order := "the source's clients switched before any source member went"
				if o.HoldSource > 0 {
					order = fmt.Sprintf("the destination took the majority first, holding %d source member(s) until the source's clients switched (--hold-source)", o.HoldSource)
				}
				_, _ = fmt.Fprintf(cmd.OutOrStdout(), "order of every move: %s; --max-learners %d\n", order, o.MaxLearners)
				werr := errors.Join(demo.WriteBenchTable(cmd.OutOrStdout(), results), writeSpreads(cmd.OutOrStdout(), results), demo.WriteBenchTimelines(cmd.OutOrStdout(), results))
				if err == nil {
					err = werr
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.DurationSliceVar(&rtts, "rtt", []time.Duration{0, 50 * time.Millisecond, 180 * time.Millisecond}, "round trip times to run")
	f.IntSliceVar(&keys, "preload-keys", []int{1000, 10000, 100000}, "numbers of preloaded keys to run")
	f.IntVar(&runs, "runs", 1, "runs of each RTT and preload, one after another, each on fresh sites; above 1 a second table gives each one's median and worst")
	f.IntVar(&o.PreloadValueSize, "preload-value-size", 1024, "size in bytes of each preloaded value")
	f.DurationVar(&o.Before, "before", 5*time.Second, "client traffic before each move")
	f.DurationVar(&o.After, "after", 5*time.Second, "client traffic after each move")
	f.IntVar(&o.MaxLearners, "max-learners", membership.DefaultMaxLearners, maxLearnersUsage)
	f.Int32Var(&o.HoldSource, "hold-source", livemove.DefaultHoldSource, holdSourceUsage)
	f.StringVar(&o.Dir, "dir", "", "keep each run's sites (their logs, the pods' files) in a folder of this one named after the run, such as rtt-180ms-keys-10000 (default: a temporary folder per run, removed)")
	f.BoolVar(&o.Baseline, "baseline", true, "after each move, run the hand-scripted clientv3 move (same members, data and sites) and print its time and the ratio")
	return cmd
}

// writeSpreads prints the spread of repeated runs under a blank line, or
// nothing when every case ran once.
func writeSpreads(w io.Writer, results []demo.BenchResult) error {
	spreads := demo.Spreads(results)
	if len(spreads) == 0 {
		return nil
	}
	_, _ = fmt.Fprintln(w, "\nrepeated runs:")
	return demo.WriteBenchSpreads(w, spreads)
}
