// Command druid-stretch runs the parts of druid-stretch: the membership
// controller, the sidecar beside each etcd member, the live migration, the
// standalone rebalancer, the demo and the benchmarks.
package main

import (
	"os"

	"github.com/druid-stretch/druid-stretch/internal/cli"
	"github.com/druid-stretch/druid-stretch/internal/democli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], democli.NewDemoCommand(), democli.NewBenchCommand()))
}
