package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// EtcdMembership is druid-stretch's spec and status for the Etcd of the same
// name in the same namespace: which members of that etcd cluster other
// Kubernetes clusters run, what to do with them, and the membership as the
// controller observed it. The Etcd stays etcd-druid's own object, written by
// gardenlet, druid and kubectl with druid's type; nothing of druid-stretch's
// lives in it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=etcdmember,categories=druid-stretch
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.membership.phase`
// +kubebuilder:printcolumn:name="Attached",type=string,JSONPath=`.status.conditions[?(@.type=="Attached")].status`
// +kubebuilder:printcolumn:name="Ordinal Start",type=integer,JSONPath=`.spec.ordinalStart`
// +kubebuilder:printcolumn:name="Policy",type=string,JSONPath=`.spec.externalMembersPolicy`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type EtcdMembership struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EtcdMembershipSpec   `json:"spec,omitempty"`
	Status EtcdMembershipStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// EtcdMembershipList is a list of EtcdMembership.
type EtcdMembershipList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EtcdMembership `json:"items"`
}

// EtcdMembershipSpec is druid-stretch's spec of one Etcd. Rules that also
// read the Etcd's own fields (replicas, memberNamePrefix, peer TLS, druid's
// additional peer URLs) are checked by the controller against the pair, and
// a violation blocks every membership change with a condition naming it.
type EtcdMembershipSpec struct {
	v1alpha1.MembershipSpec `json:",inline"`
}

// EtcdMembershipStatus is what the membership controller observed.
type EtcdMembershipStatus struct {
	// ObservedGeneration is the metadata.generation of this object the
	// controller last planned from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Attached says whether the Etcd of the same name exists
	// and, when it does not, what the controller waits for.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Membership is the etcd membership as the controller last observed it,
	// and what it did about it.
	// +optional
	Membership *v1alpha1.MembershipStatus `json:"membership,omitempty"`
}

// ConditionAttached is the condition type that says whether the Etcd of the
// same name exists.
const ConditionAttached = "Attached"

// Reasons of the Attached condition.
const (
	// ReasonEtcdFound: the Etcd exists and the controller plans from the pair.
	ReasonEtcdFound = "EtcdFound"
	// ReasonEtcdNotFound: there is no Etcd of this name in this namespace;
	// nothing is planned until it is created.
	ReasonEtcdNotFound = "EtcdNotFound"
)
