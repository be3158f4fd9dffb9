// Package v1alpha1 is druid-stretch's own API group,
// druid-stretch.druid.gardener.cloud: the EtcdMembership, which carries
// druid-stretch's spec and status for an Etcd of etcd-druid's own type.
//
// An EtcdMembership attaches to the Etcd of the same name in the same
// namespace. druid's Etcd CRD stays druid's: gardenlet re-applies it on every
// seed reconcile, and the API server prunes every field outside its schema at
// the next write of an Etcd, so druid-stretch's fields cannot live there.
//
// +kubebuilder:object:generate=true
// +groupName=druid-stretch.druid.gardener.cloud
package v1alpha1
