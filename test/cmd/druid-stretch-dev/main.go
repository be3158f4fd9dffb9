// Command druid-stretch-dev holds what developers run and a cluster never
// does: the live-move demo and benchmarks on real local sites, and the
// writer of the container image. It is not shipped in the image.
package main

import (
	"os"

	"github.com/druid-stretch/druid-stretch/internal/cli"
	"github.com/druid-stretch/druid-stretch/test/devcli"
)

func main() {
	os.Exit(cli.Run(devcli.NewRootCommand(), os.Args[1:]))
}
