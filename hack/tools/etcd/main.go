// Command etcd is etcd's own server entry point, built from the etcd version
// pinned in go.mod so that the tests run the server release the client is
// built against.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
