// Package crdtest runs the extended Etcd CRD of earlier releases
// (internal/testing/extendedcrd; the chart no longer ships it, but Etcds stored under
// it are upgraded from it) on a real kube-apiserver: druid's own example objects are stored unchanged,
// every invalid extension is refused with a message naming the field, and a
// client that knows only druid's Etcd type keeps the extension fields. It
// holds tests only.
package crdtest
