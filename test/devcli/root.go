// Package devcli is the command line of druid-stretch-dev, the developer's
// binary: the demo and bench (the live move on two real sites of this
// machine, once or per RTT and preload) and the container image writer.
// They live apart from internal/cli, and so out of the shipped druid-stretch
// binary, because the sites pull in the test site package (the Kubernetes
// control plane, etcd-druid, the node stand-in), which the shipped parts
// must not depend on, and because a running controller has no use for them.
package devcli

import (
	"github.com/spf13/cobra"

	"github.com/druid-stretch/druid-stretch/internal/cli"
)

// NewRootCommand is druid-stretch-dev's root command.
func NewRootCommand() *cobra.Command {
	root := cli.NewRoot("druid-stretch-dev", "Developer commands of druid-stretch: the demo, the benchmarks and the container image")
	root.AddCommand(NewDemoCommand(), NewBenchCommand(), newImageCommand(), cli.NewVersionCommand())
	return root
}
