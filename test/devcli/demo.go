package devcli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
	"github.com/druid-stretch/druid-stretch/test/framework/demo"
	"github.com/druid-stretch/druid-stretch/test/framework/report"
)

// NewDemoCommand runs the live move on this machine between two sites of
// real parts, judged by client-go clients through a kube-apiserver per
// site, then prints the report.
func NewDemoCommand() *cobra.Command {
	var o demo.SiteOptions
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Move a shoot's etcd live between two local Kubernetes clusters of real parts and report what the clients saw",
		Long: `Run everything locally, as root: two sites A and B, each a Kubernetes cluster of
real parts (kube-apiserver, kube-controller-manager, kube-scheduler, etcd-druid,
druid-stretch from its chart, and a node stand-in that runs the pods: the real
etcdbrctl, etcd and the druid-stretch sidecar), peered --rtt apart. A shoot's
etcd-main is created in A; a shoot kube-apiserver runs in each site on its own
site's etcd client Service, with client-go clients writing and reading through
it. The Etcd then moves live to B: B's members join as learners side by
side, B takes the majority while one member of A stays for A's clients
(--hold-source), the clients switch to B's kube-apiserver, and the last
member of A goes; the report says per
kube-apiserver: requests by outcome and failure class, the longest write gap,
/readyz over time; over all of them: lost acknowledged writes and
linearizability; and migration time, time in tie, time without a leader, etcd
panics. The binaries are built on first use (hack/test-binaries.sh).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.GEP39 && !cmd.Flags().Changed("hold-source") {
				o.HoldSource = 0 // GEP-39's stages hold no member
			}
			o.Out = cmd.OutOrStdout()
			rep, err := runOnSites(cmd.Context(), o)
			if err != nil {
				return err
			}
			return judge(cmd.OutOrStdout(), rep)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.RTT, "rtt", 180*time.Millisecond, "round trip time between the two sites")
	f.IntVar(&o.PreloadKeys, "preload-keys", 10000, "keys written before the move, so joining members have data to catch up on")
	f.IntVar(&o.PreloadValueSize, "preload-value-size", 1024, "size in bytes of each preloaded value")
	f.DurationVar(&o.Before, "before", 5*time.Second, "client traffic before the move starts (the baseline)")
	f.DurationVar(&o.After, "after", 5*time.Second, "client traffic after the move ended")
	f.StringVar(&o.ReportPath, "report", "", "write the report as JSON to this file")
	f.StringVar(&o.PlotPath, "plot", "", "draw the kube-apiservers' write latency, their /readyz and the own client's writes over time, steps marked, into this .svg file")
	f.StringVar(&o.Dir, "dir", "", "folder for the sites' logs and the pods' files (default: a temporary folder, removed afterwards)")
	f.BoolVar(&o.KeepDir, "keep", false, "keep the temporary folder with the logs")
	f.IntVar(&o.MaxLearners, "max-learners", membership.DefaultMaxLearners, maxLearnersUsage)
	f.Int32Var(&o.HoldSource, "hold-source", livemove.DefaultHoldSource, holdSourceUsage)
	f.BoolVar(&o.GEP39, "gep39", false, "move as Gardener's GEP-39 does: druid's own Etcd fields only, stage by stage; the destination's members take a member name prefix and ordinals from 0; nothing is held (--hold-source does not apply)")
	f.BoolVar(&o.Baseline, "baseline", false, "after the move, run a hand-scripted clientv3 move of the same cluster on the same sites and report its time beside the product's")
	return cmd
}

// maxLearnersUsage is the help of --max-learners, which demo and bench share.
const maxLearnersUsage = "druid-stretch's --max-learners on both sites: how many destination members join as learners at once (etcd's max-learners is set to match)"

// holdSourceUsage is the help of --hold-source, which demo and bench share.
const holdSourceUsage = "0: the source's clients switch before any source member goes; N above 0: the destination takes the majority first, holding N source members for the source's clients until they are switched (its kube-apiserver then starts on a quorum in its own site)"

// runOnSites runs the demo; the tests of the verdict replace it.
var runOnSites = demo.RunOnSites

// judge prints the report's verdict as the demo's last line and fails the
// command (exit 1) when a guarantee broke. A missed target (a tie or a
// write gap of a second or more, which a busy machine causes) is named in
// the line and fails nothing.
func judge(out io.Writer, rep report.Report) error {
	_, _ = fmt.Fprintln(out, rep.Verdict())
	if broken := rep.Broken(); len(broken) > 0 {
		return fmt.Errorf("the move broke %d of its guarantees: %s", len(broken), strings.Join(broken, "; "))
	}
	return nil
}
