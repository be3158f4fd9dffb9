// Package crdtest runs the generated Etcd CRD (charts/druid-stretch/crds) on
// a real kube-apiserver: druid's own example objects are stored unchanged,
// every invalid extension is refused with a message naming the field, and a
// client that knows only druid's Etcd type keeps the extension fields. It
// holds tests only.
package crdtest
