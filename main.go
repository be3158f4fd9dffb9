// Command druid-stretch runs the shipped parts of druid-stretch: the
// membership controller with its webhooks, the sidecar beside each etcd
// member, the live migration and the standalone rebalancer. The demo, the
// benchmarks and the image writer are in test/cmd/druid-stretch-dev.
package main

import (
	"os"

	"github.com/druid-stretch/druid-stretch/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}
