package v1alpha1

import (
	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
)

// GetOrdinalStart is spec.ordinalStart, 0 when unset.
func (s *MembershipSpec) GetOrdinalStart() int32 {
	if s.OrdinalStart == nil {
		return 0
	}
	return *s.OrdinalStart
}

// GetExternalMembersPolicy is spec.externalMembersPolicy, Keep when unset.
// Unset has no schema default so that an Etcd written by druid is stored
// exactly as written.
func (s *MembershipSpec) GetExternalMembersPolicy() ExternalMembersPolicy {
	if s.ExternalMembersPolicy == nil {
		return ExternalMembersPolicyKeep
	}
	return *s.ExternalMembersPolicy
}

// GetRetainedExternalMembers is spec.retainedExternalMembers, 0 when unset.
func (s *MembershipSpec) GetRetainedExternalMembers() int {
	if s.RetainedExternalMembers == nil {
		return 0
	}
	return int(*s.RetainedExternalMembers)
}

// GetLearnerReplicas is spec.learnerReplicas, 0 when unset.
func (s *MembershipSpec) GetLearnerReplicas() int32 {
	if s.LearnerReplicas == nil {
		return 0
	}
	return *s.LearnerReplicas
}

// ExternalMember returns the external member with the given name.
func (s *MembershipSpec) ExternalMember(name string) (ExternalMember, bool) {
	for _, m := range s.ExternalMembers {
		if m.Name == name {
			return m, true
		}
	}
	return ExternalMember{}, false
}

// DruidEtcd is a deep copy of e as druid's own type, without the extension,
// for druid's helpers (resource names, labels, owner references). Helpers
// that count pods from ordinal 0 (druid's GetAllPodNames, GetMemberLeaseNames)
// ignore ordinalStart: use package members for names instead.
func (e *Etcd) DruidEtcd() *druidv1alpha1.Etcd {
	out := &druidv1alpha1.Etcd{
		TypeMeta:   e.TypeMeta,
		ObjectMeta: *e.ObjectMeta.DeepCopy(),
		Spec:       *e.Spec.EtcdSpec.DeepCopy(),
		Status:     *e.Status.EtcdStatus.DeepCopy(),
	}
	return out
}

// UsesExtension reports whether e uses a druid-stretch extension field:
// ordinalStart, externalMembers or externalMembersPolicy. An Etcd that uses
// none is druid's alone: no sidecar is injected and no membership is managed.
func (e *Etcd) UsesExtension() bool {
	return e.Spec.OrdinalStart != nil || len(e.Spec.ExternalMembers) > 0 || e.Spec.ExternalMembersPolicy != nil
}

// Votes reports whether the observed member is a voter (the leader
// included), not a learner.
func (m ObservedMember) Votes() bool {
	return m.Role == MemberRoleVoter || m.Role == MemberRoleLeader
}

// Voters are the names of the observed members that vote, in status order.
func (s *MembershipStatus) Voters() []string {
	if s == nil {
		return nil
	}
	var out []string
	for _, m := range s.Members {
		if m.Votes() {
			out = append(out, m.Name)
		}
	}
	return out
}
