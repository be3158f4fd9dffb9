//go:build tools

// Package tools pins the etcd-druid manager that hack/test-binaries.sh builds,
// so that `go mod tidy` keeps its dependencies. It is a module of its own
// because etcd-druid must never enter the project's own go.mod: the project
// talks to druid through its CRD, not its code, and druid's dependency graph
// would otherwise constrain the project's.
package tools

import _ "github.com/gardener/etcd-druid/cmd"
