//go:build tools

// Package tools pins etcdbrctl, the backup-restore sidecar that
// hack/test-binaries.sh builds, so that `go mod tidy` keeps its dependencies.
// It is a module of its own because etcd-backup-restore must never enter the
// project's own go.mod: it embeds an etcd v3.5 server and cloud SDKs, while the
// project builds on etcd v3.6.
package tools

import _ "github.com/gardener/etcd-backup-restore"
