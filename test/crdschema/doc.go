// Package crdschema checks the extended Etcd CRD of earlier releases
// (internal/testing/extendedcrd; the chart no longer ships it, but Etcds stored under
// it are upgraded from it) without a kube-apiserver: its schema is druid's
// plus the extension and nothing else, and the Go
// validation in api/v1alpha1/validation judges every object as the CRD's
// OpenAPI schema and CEL rules do. It holds tests only; they live in the
// root module, not the api module, so that the api module needs none of the
// apiserver's packages.
package crdschema
