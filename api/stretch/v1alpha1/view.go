package v1alpha1

import (
	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// SpecSource is where the membership spec of an Etcd's View came from.
type SpecSource string

const (
	// SpecNone: neither the Etcd nor an EtcdMembership carries one; the Etcd
	// is druid's alone.
	SpecNone SpecSource = ""
	// SpecFromEtcd: the Etcd carries druid-stretch's fields inline, as the
	// extended Etcd CRD of earlier releases stored them. They win while they
	// are there, and the controller copies them into the EtcdMembership.
	SpecFromEtcd SpecSource = "Etcd"
	// SpecFromEtcdMembership: the EtcdMembership carries them.
	SpecFromEtcdMembership SpecSource = "EtcdMembership"
	// SpecFromBootstrap: only druid's own spec.etcd.bootstrapWithExistingCluster
	// (or, once it is unset, druid's record of the join) says that the Etcd
	// joined another cluster, as GEP-39 writes it (see FromBootstrap).
	SpecFromBootstrap SpecSource = "BootstrapWithExistingCluster"
	// SpecFromNamespace: nothing sets a membership field, and the Etcd's
	// namespace is one whose Etcds the controller opts in (its
	// --manage-etcds-in-namespaces): it is planned with ordinalStart 0
	// until its EtcdMembership says so itself. View never returns it; the
	// controller and the webhook decide it, since it needs the namespace.
	SpecFromNamespace SpecSource = "Namespace"
)

// View is the Etcd as druid-stretch plans it: druid's fields from e, the
// membership spec and status from m (which may be nil). The Etcd's own inline
// fields, where an Etcd still carries them, win over m's spec; m's status
// wins over the Etcd's, because druid's compaction controller replaces the
// Etcd's whole status and never touches m. Where neither sets the external
// members (or the learner replicas), druid's own bootstrap fields fill them
// in (FromBootstrap): a GEP-39 move needs no field of druid-stretch's. e and
// m are not changed.
//
// The View's metadata.generation is the Etcd's plus m's: it grows whenever
// either spec changes, so that status.membership.observedGeneration, which
// the controller writes from the View it planned, tells a reader whether
// the controller has seen the current pair. The Etcd's own generation
// alone would not: a change of m's spec leaves it as it was, and a stale
// status would pass for current.
func View(e *v1alpha1.Etcd, m *EtcdMembership) (*v1alpha1.Etcd, SpecSource) {
	v := e.DeepCopy()
	if m != nil {
		v.Generation += m.Generation
	}
	src := SpecNone
	switch {
	case !IsZero(&e.Spec.MembershipSpec):
		src = SpecFromEtcd
	case m != nil:
		v.Spec.MembershipSpec = *m.Spec.MembershipSpec.DeepCopy()
		if !IsZero(&v.Spec.MembershipSpec) {
			src = SpecFromEtcdMembership
		}
	}
	if b, ok := FromBootstrap(e); ok && src != SpecFromEtcd {
		b.apply(&v.Spec.MembershipSpec)
		if src == SpecNone {
			src = SpecFromBootstrap
		}
	}
	if m != nil && m.Status.Membership != nil {
		v.Status.Membership = m.Status.Membership.DeepCopy()
	}
	return v, src
}

// IsZero reports whether s sets no field.
func IsZero(s *v1alpha1.MembershipSpec) bool {
	return s.OrdinalStart == nil && len(s.ExternalMembers) == 0 && s.ExternalMembersPolicy == nil &&
		s.RetainedExternalMembers == nil && s.LearnerReplicas == nil && len(s.AdditionalAdvertisePeerURLs) == 0
}

// For returns the EtcdMembership of e carrying spec: same name and namespace,
// owned by e (when e has a UID) so that it goes when e goes.
func For(e *v1alpha1.Etcd, spec v1alpha1.MembershipSpec) *EtcdMembership {
	m := &EtcdMembership{Spec: EtcdMembershipSpec{MembershipSpec: *spec.DeepCopy()}}
	m.SetGroupVersionKind(GroupVersion.WithKind("EtcdMembership"))
	m.Name, m.Namespace = e.Name, e.Namespace
	if e.UID != "" {
		m.OwnerReferences = []metav1.OwnerReference{OwnerReference(e)}
	}
	return m
}

// OwnerReference is e as the owner of its EtcdMembership: not a controller
// reference (druid controls nothing of it), and not blocking e's deletion.
func OwnerReference(e *v1alpha1.Etcd) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Etcd", Name: e.Name, UID: e.UID}
}

// Split is the inverse of View for a writer that knows druid's Etcd type
// only (gardenlet): v, a View changed by the caller (the migration steps of
// api/v1alpha1/migration change Views), becomes druid's Etcd, without any of
// druid-stretch's fields, and the EtcdMembership that carries them, to be
// written each to its own resource (the EtcdMembership first, so that
// druid-stretch sees the fields before druid acts on the Etcd).
// status.membership stays with neither: only the controller writes it.
// The Etcd's metadata.generation is the View's (the pair's); the API
// server keeps its own on every write. What the View derives from druid's
// bootstrap fields stays out of the EtcdMembership (Own); a caller that
// changed those fields on v takes the EtcdMembership's spec from
// Own(v, stored) instead, stored being the Etcd v was viewed from.
func Split(v *v1alpha1.Etcd) (*druidv1alpha1.Etcd, *EtcdMembership) {
	e := v.DruidEtcd()
	m := For(v, Own(v))
	return e, m
}
