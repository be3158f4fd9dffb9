package v1alpha1

import (
	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The markers below repeat druid's markers on its Etcd type, because the
// root type is ours: subresources, printer columns and druid's CEL rules keep
// their druid text, except the additionalAdvertisePeerURLs index rule, which
// allows the ordinal range [ordinalStart, ordinalStart+replicas) and reduces to
// druid's "index < replicas" when ordinalStart is unset. The last rule is the
// extension's: an external member must not take a local member's name. It
// binds the name stem once with [stem].all(p, ...), CEL's idiom for a local
// variable, to keep the estimated cost within the apiserver's budget.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Quorate",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="All Members Ready",type=string,JSONPath=`.status.conditions[?(@.type=="AllMembersReady")].status`
// +kubebuilder:printcolumn:name="Backup Ready",type=string,JSONPath=`.status.conditions[?(@.type=="BackupReady")].status`
// +kubebuilder:printcolumn:name="Cluster ID Mismatch",type=string,JSONPath=`.status.conditions[?(@.type=="ClusterIDMismatch")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Cluster Size",type=integer,JSONPath=`.spec.replicas`,priority=1
// +kubebuilder:printcolumn:name="Current Replicas",type=integer,JSONPath=`.status.currentReplicas`,priority=1
// +kubebuilder:printcolumn:name="Ready Replicas",type=integer,JSONPath=`.status.readyReplicas`,priority=1
// +kubebuilder:printcolumn:name="Ordinal Start",type=integer,JSONPath=`.spec.ordinalStart`,priority=1
// +kubebuilder:printcolumn:name="Membership",type=string,JSONPath=`.status.membership.phase`,priority=1
// +kubebuilder:validation:XValidation:rule="!has(self.spec.etcd.additionalAdvertisePeerURLs) || self.spec.etcd.additionalAdvertisePeerURLs.all(m, has(self.spec.memberNamePrefix) ? m.memberName.startsWith(self.spec.memberNamePrefix + '-' + self.metadata.name + '-') : m.memberName.startsWith(self.metadata.name + '-'))",message="additionalAdvertisePeerURLs member names must start with the Etcd resource name followed by a dash"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.etcd.additionalAdvertisePeerURLs) || self.spec.etcd.additionalAdvertisePeerURLs.all(m, int(m.memberName.substring(m.memberName.lastIndexOf('-')+1)) >= (has(self.spec.ordinalStart) ? self.spec.ordinalStart : 0) && int(m.memberName.substring(m.memberName.lastIndexOf('-')+1)) < (has(self.spec.ordinalStart) ? self.spec.ordinalStart : 0) + self.spec.replicas)",message="additionalAdvertisePeerURLs member name index must be in [ordinalStart, ordinalStart+replicas), that is less than replicas when ordinalStart is unset",fieldPath=".spec.etcd.additionalAdvertisePeerURLs"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.etcd.bootstrapWithExistingCluster) || !has(oldSelf.spec.etcd.bootstrapWithExistingCluster) || !has(self.status) || !has(self.status.conditions) || !self.status.conditions.exists(c, c.type == 'BootstrappedWithExistingCluster' && c.status == 'False') || self.spec.etcd.bootstrapWithExistingCluster.members == oldSelf.spec.etcd.bootstrapWithExistingCluster.members",message="etcd.spec.etcd.bootstrapWithExistingCluster.members cannot be modified while the bootstrap is in progress"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.etcd.bootstrapWithExistingCluster) || !has(oldSelf.spec.etcd.bootstrapWithExistingCluster) || !has(self.status) || !has(self.status.conditions) || !self.status.conditions.exists(c, c.type == 'BootstrappedWithExistingCluster' && c.status == 'False') || self.spec.etcd.bootstrapWithExistingCluster.clientEndpoints == oldSelf.spec.etcd.bootstrapWithExistingCluster.clientEndpoints",message="etcd.spec.etcd.bootstrapWithExistingCluster.clientEndpoints cannot be modified while the bootstrap is in progress"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.etcd.bootstrapWithExistingCluster) || self.spec.etcd.bootstrapWithExistingCluster.members.all(m1, self.spec.etcd.bootstrapWithExistingCluster.members.filter(m2, m1.name == m2.name).size() == 1)",message="bootstrapWithExistingCluster.members[*].name must be unique"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.etcd.bootstrapWithExistingCluster) || self.spec.etcd.bootstrapWithExistingCluster.members.all(m, has(self.spec.memberNamePrefix) ? !m.name.startsWith(self.spec.memberNamePrefix + '-' + self.metadata.name + '-') : !m.name.startsWith(self.metadata.name + '-'))",message="bootstrapWithExistingCluster.members[*].name must not collide with a target member (must not start with the target Etcd's member-name prefix)"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.externalMembers) || [(has(self.spec.memberNamePrefix) && self.spec.memberNamePrefix != '' ? self.spec.memberNamePrefix + '-' : '') + self.metadata.name + '-'].all(p, self.spec.externalMembers.all(m, !m.name.startsWith(p) || [m.name.substring(size(p))].all(d, !d.matches('^(0|[1-9][0-9]{0,9})$') || int(d) < (has(self.spec.ordinalStart) ? self.spec.ordinalStart : 0) || int(d) >= (has(self.spec.ordinalStart) ? self.spec.ordinalStart : 0) + self.spec.replicas)))",message="an external member must not take the name of a local member: local members are named [<memberNamePrefix>-]<etcd name>-<ordinal> for the ordinals [ordinalStart, ordinalStart+replicas)",fieldPath=".spec.externalMembers"

// Etcd is etcd-druid's Etcd with druid-stretch's extension: an etcd cluster
// whose members may live in several Kubernetes clusters. Its JSON is druid's
// Etcd plus the extension fields; druid reads and writes it unchanged.
type Etcd struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EtcdSpec   `json:"spec,omitempty"`
	Status EtcdStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// EtcdList is a list of Etcd.
type EtcdList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Etcd `json:"items"`
}

// EtcdSpec is druid's EtcdSpec plus the membership extension.
//
// +kubebuilder:validation:XValidation:rule="!has(self.externalMembers) || self.externalMembers.all(m, m.peerURLs.all(u, u.startsWith(has(self.etcd.peerUrlTls) ? 'https://' : 'http://')))",message="peer URLs of external members must use https:// when spec.etcd.peerUrlTls is set and http:// when it is not: every member of one etcd cluster speaks the same peer protocol",fieldPath=".externalMembers"
// +kubebuilder:validation:XValidation:rule="!has(self.externalMembers) || !has(self.etcd.additionalAdvertisePeerURLs) || self.externalMembers.all(m, m.peerURLs.all(u, self.etcd.additionalAdvertisePeerURLs.all(a, !(u in a.urls))))",message="a peer URL of an external member must not be one that a local member advertises in spec.etcd.additionalAdvertisePeerURLs: etcd identifies a member by its peer URLs",fieldPath=".externalMembers"
// +kubebuilder:validation:XValidation:rule="!has(self.externalMembersPolicy) || self.externalMembersPolicy != 'Retire' || self.replicas > 0",message="Retire moves every vote to the local members, so spec.replicas must be at least 1",fieldPath=".externalMembersPolicy"
// +kubebuilder:validation:XValidation:rule="!has(self.learnerReplicas) || self.learnerReplicas == 0 || self.learnerReplicas < self.replicas",message="learnerReplicas must be less than spec.replicas: at least one local member votes, the others may wait as learners",fieldPath=".learnerReplicas"
type EtcdSpec struct {
	druidv1alpha1.EtcdSpec `json:",inline"`
	MembershipSpec         `json:",inline"`
}

// MembershipSpec is druid-stretch's part of an Etcd's spec: how its members
// span Kubernetes clusters. An EtcdMembership carries it for an Etcd of
// druid's own type; the extended Etcd carries it inline.
type MembershipSpec struct {
	// OrdinalStart is the first ordinal of the local members: the pods are
	// <etcd name>-<ordinal> for the ordinals [ordinalStart, ordinalStart+replicas),
	// as StatefulSet spec.ordinals.start makes them. Unset means 0, druid's
	// naming. Changing it moves the local members to the new ordinal range
	// live: the membership controller adds a member of the new range, then
	// removes one of the old range, one step at a time.
	// +optional
	// +kubebuilder:validation:Minimum=0
	OrdinalStart *int32 `json:"ordinalStart,omitempty"`

	// ExternalMembers are members of this etcd cluster that another cluster
	// runs and manages: the local members join them, and the controller never
	// adds them. A member in etcd that is neither local nor listed here is
	// reported as unmanaged and left alone.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=10
	// +kubebuilder:validation:XValidation:rule="self.all(a, self.all(b, a.name == b.name || a.peerURLs.all(u, !(u in b.peerURLs))))",message="a peer URL must belong to one external member only: etcd identifies a member by its peer URLs"
	ExternalMembers []ExternalMember `json:"externalMembers,omitempty"`

	// ExternalMembersPolicy says what the controller does with the external
	// members: Keep (the default when unset) keeps them as voting members, a
	// stretched cluster; Retire moves every vote to the local members and
	// removes the external members from the etcd cluster.
	// +optional
	ExternalMembersPolicy *ExternalMembersPolicy `json:"externalMembersPolicy,omitempty"`

	// RetainedExternalMembers is how many external members the Retire policy
	// leaves voting until it is lowered; unset means 0. The controller
	// retires the external members in its usual order (never the leader
	// first, removals interleaved with additions) and stops when that many
	// are left. A live move sets it to
	// 1, so that the source site keeps one member for the clients that still
	// reach the cluster there (its kube-apiserver, whose etcd endpoint is the
	// source's client Service) while the votes move over, and lowers it to 0
	// once those clients are switched to the destination: a kube-apiserver
	// whose every etcd member is gone still answers /readyz and fails every
	// request. Under the Keep policy it has no effect.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10
	RetainedExternalMembers *int32 `json:"retainedExternalMembers,omitempty"`

	// LearnerReplicas is how many of the local members, those of the
	// highest ordinals, join the etcd cluster as learners and stay
	// learners, without a vote, until it is lowered; unset means 0. A
	// learner receives the whole log and catches up, but counts for no
	// quorum: a live move sets it on the destination while the source's
	// clients are switched, so that the destination's further members are
	// caught up when the votes move over, without a vote on the
	// destination's side that a cut between the clusters would cost. Once
	// it is lowered they are promoted at once, in the controller's usual
	// order. A member that votes already stays a voter (etcd cannot make
	// a voter a learner again). The learners count against etcd's
	// --max-learners; those that do not fit wait, and the status says so.
	// +optional
	// +kubebuilder:validation:Minimum=0
	LearnerReplicas *int32 `json:"learnerReplicas,omitempty"`

	// AdditionalAdvertisePeerURLs are further peer URLs of local members,
	// as druid's spec.etcd.additionalAdvertisePeerURLs gives them (after
	// druid's in-cluster peer URL), for the members druid's own field
	// cannot hold: druid admits an entry only for the ordinals
	// 0..spec.replicas-1, so the members of a range that starts later
	// (spec.ordinalStart, the destination of a move in the same shoot
	// namespace) are listed here. Each entry names a local member at an
	// ordinal from spec.replicas on; the members below that belong in
	// druid's field, which druid renders into its configuration.
	// +optional
	// +listType=map
	// +listMapKey=memberName
	// +kubebuilder:validation:MaxItems=10
	AdditionalAdvertisePeerURLs []MemberPeerURLs `json:"additionalAdvertisePeerURLs,omitempty"`
}

// MemberPeerURLs are the further peer URLs of one local member.
type MemberPeerURLs struct {
	// MemberName is the etcd member name, [<memberNamePrefix>-]<etcd name>-<ordinal>.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?-[0-9]+$')`,message="must be an etcd member name, [<memberNamePrefix>-]<etcd name>-<ordinal>"
	MemberName string `json:"memberName"`

	// URLs are the member's further peer URLs, scheme://host:port.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=5
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:XValidation:rule=`self.matches(r'^https?://([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*|\[[0-9a-f:.]+\]):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$')`,message="must be an http:// or https:// URL scheme://host:port with a lowercase host, a port in 1-65535 and no path, as etcd takes member URLs"
	URLs []string `json:"urls"`
}

// ExternalMembersPolicy is what the controller does with the external members.
// +kubebuilder:validation:Enum=Keep;Retire
type ExternalMembersPolicy string

const (
	// ExternalMembersPolicyKeep keeps the external members as voting members
	// beside the local ones: a stretched cluster, or the source side of a move.
	ExternalMembersPolicyKeep ExternalMembersPolicy = "Keep"
	// ExternalMembersPolicyRetire moves every vote to the local members and
	// removes the external members: the destination side finishing a move.
	ExternalMembersPolicyRetire ExternalMembersPolicy = "Retire"
)

// ExternalMember is a member of the same etcd cluster that another Kubernetes
// cluster runs.
//
// +kubebuilder:validation:XValidation:rule="self.peerURLs == oldSelf.peerURLs",message="peerURLs of a listed external member cannot change: etcd knows a member by its peer URLs, so remove the member and add it again under a new name"
type ExternalMember struct {
	// Name is the etcd member name (etcd's --name), for a druid-managed
	// member <memberNamePrefix>-<pod name>.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')`,message="must be a lowercase RFC 1123 subdomain, as etcd-druid's member and lease names are"
	Name string `json:"name"`

	// PeerURLs are the member's advertised peer URLs, scheme://host:port
	// without a path, as etcd's --initial-advertise-peer-urls takes them.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=5
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:XValidation:rule=`self.matches(r'^https?://([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*|\[[0-9a-f:.]+\]):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$')`,message="must be an http:// or https:// URL scheme://host:port with a lowercase host, a port in 1-65535 and no path, as etcd takes member URLs"
	PeerURLs []string `json:"peerURLs"`

	// ClientURLs are the member's advertised client URLs, in the same form.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=5
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:XValidation:rule=`self.matches(r'^https?://([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*|\[[0-9a-f:.]+\]):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$')`,message="must be an http:// or https:// URL scheme://host:port with a lowercase host, a port in 1-65535 and no path, as etcd takes member URLs"
	ClientURLs []string `json:"clientURLs,omitempty"`

	// SidecarURL is the base URL of the member's druid-stretch sidecar. The
	// controller needs it to act before any local member runs (the first
	// learner of a move is added through an external member's sidecar).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^https?://([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*|\[[0-9a-f:.]+\])(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?(/[-a-zA-Z0-9._~/]*)?$')`,message="must be an http:// or https:// URL with a lowercase host, an optional port in 1-65535, an optional path and no query or fragment"
	SidecarURL string `json:"sidecarURL,omitempty"`
}

// EtcdStatus is druid's EtcdStatus plus what the membership controller
// observed. druid patches its own fields; the controller patches membership.
type EtcdStatus struct {
	druidv1alpha1.EtcdStatus `json:",inline"`

	// Membership is the etcd membership as the druid-stretch controller last
	// observed it, and what it did about it.
	// +optional
	Membership *MembershipStatus `json:"membership,omitempty"`
}
