// Command etcd-wrapper stands in for the etcd-wrapper image of etcd-druid's
// etcd container: see package etcdwrapper.
package main

import (
	"os"

	"github.com/druid-stretch/druid-stretch/test/infrastructure/standin/etcdwrapper"
)

func main() { os.Exit(etcdwrapper.Main(os.Args[1:])) }
