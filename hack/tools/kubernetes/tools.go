//go:build tools

// Package tools pins the Kubernetes control-plane commands that
// hack/test-binaries.sh builds, so that `go mod tidy` keeps their
// dependencies. It is a module of its own because k8s.io/kubernetes must never
// enter the project's own go.mod: it is not meant to be imported as a library
// and would drag its replace-heavy dependency graph into every build.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
