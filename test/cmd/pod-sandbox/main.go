// Command pod-sandbox becomes one container of a Pod that the node stand-in
// runs as host processes: see package sandbox.
package main

import (
	"fmt"
	"os"

	"github.com/druid-stretch/druid-stretch/test/infrastructure/podhost/sandbox"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pod-sandbox SPEC.json")
		os.Exit(2)
	}
	err := sandbox.Main(os.Args[1])
	// Main returns only when the exec did not happen.
	fmt.Fprintln(os.Stderr, "pod-sandbox:", err)
	os.Exit(127)
}
