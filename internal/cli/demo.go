package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/druid-stretch/druid-stretch/internal/demo"
)

// newDemoCommand runs the live move on this machine: two kube-apiservers,
// their controllers, real etcd members, a WAN between them and a client
// workload, then the report.
func newDemoCommand() *cobra.Command {
	var o demo.Options
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Move a running etcd cluster live between two local Kubernetes clusters and report what the clients saw",
		Long: `Run everything locally: two real kube-apiservers (A and B; the binaries are
built on first use), a membership controller and a pod runner for each, 3 etcd
members in A, the WAN emulator between A and B, and a client workload writing
and reading throughout. Then move the etcd cluster from A to B live and report:
migration time, failed requests, lost acknowledged writes, linearizability,
max write gap, write latency before, during and after, and time in tie.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Out = cmd.OutOrStdout()
			_, err := demo.Run(cmd.Context(), o)
			return err
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.RTT, "rtt", 180*time.Millisecond, "round trip time between the two clusters")
	f.IntVar(&o.PreloadKeys, "preload-keys", 10000, "keys written before the move, so joining members have data to catch up on")
	f.IntVar(&o.PreloadValueSize, "preload-value-size", 1024, "size in bytes of each preloaded value")
	f.DurationVar(&o.Before, "before", 5*time.Second, "client traffic before the move starts (the baseline)")
	f.DurationVar(&o.After, "after", 5*time.Second, "client traffic after the move ended")
	f.StringVar(&o.ReportPath, "report", "", "write the report as JSON to this file")
	f.StringVar(&o.PlotPath, "plot", "", "draw write latency over time, steps marked, into this .svg file")
	f.StringVar(&o.Dir, "dir", "", "folder for the members' data and the logs (default: a temporary folder, removed afterwards)")
	f.BoolVar(&o.KeepDir, "keep", false, "keep the temporary folder with data and logs")
	return cmd
}
