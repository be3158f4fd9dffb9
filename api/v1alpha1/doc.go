// Package v1alpha1 is druid-stretch's extension of etcd-druid's
// druid.gardener.cloud/v1alpha1 Etcd: druid's Go types embedded unchanged,
// plus the fields that let one etcd cluster span several Kubernetes clusters
// (spec.ordinalStart, spec.externalMembers, spec.externalMembersPolicy) and
// what the membership controller observed (status.membership).
//
// The generated CRD (charts/druid-stretch/crds) replaces druid's etcds CRD as
// a strict superset: every Etcd druid's CRD accepts is accepted and stored
// unchanged. Register either this package's scheme or druid's for the group,
// never both: they map the same kind to different Go types.
//
// +kubebuilder:object:generate=true
// +groupName=druid.gardener.cloud
package v1alpha1
