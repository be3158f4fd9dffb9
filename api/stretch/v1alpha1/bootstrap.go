package v1alpha1

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

// Bootstrap is what druid's own fields of an Etcd say about the cluster it
// joins, as GEP-39 (Gardener's live control plane migration) writes them:
// the destination Etcd is created with spec.etcd.bootstrapWithExistingCluster
// naming the source's members; druid records them in
// status.bootstrapWithExistingCluster once the join is done; gardenlet
// unsets the spec field when the source's members are to go. No field of
// druid-stretch's is needed for that move: the View reads these.
// +kubebuilder:object:generate=false
type Bootstrap struct {
	// Members are the source's members, with the peer URLs etcd knows them by.
	Members []v1alpha1.ExternalMember
	// Retire is true once the spec field is unset after druid recorded the
	// join: the members are to be removed. While the spec field is set they
	// are kept.
	Retire bool
	// LearnerReplicas keeps the Etcd's highest ordinals learners while the
	// source's members are kept, so that the source alone holds the quorum
	// (see FromBootstrap); 0 when none need to.
	LearnerReplicas int32
}

// FromBootstrap reads e's spec.etcd.bootstrapWithExistingCluster and
// status.bootstrapWithExistingCluster; ok is false when neither says that e
// joined another cluster.
//
//   - spec set: the members named there are kept, as external members with
//     the Keep policy;
//   - spec unset, status recorded (druid writes it once, when the join is
//     done, and never clears it): the members recorded there are retired;
//   - neither: nothing. A status someone dropped after the spec was unset
//     leaves the source's members unknown, so they are never removed.
//
// While the source is kept, its members hold the quorum alone: e's members
// beyond len(Members)-1 voters stay learners. Six voters, three on each
// side, would need both clusters for every write for as long as the source
// is kept (gardenlet keeps it from DestinationEtcdPeersJoined to
// EtcdMigrationComplete, minutes); with the source's three voters against
// two, a partition between the clusters leaves the source writing. The
// learner is promoted when the retirement starts, in the same sidecar call
// as the first removal, so the tie lasts one call.
func FromBootstrap(e *v1alpha1.Etcd) (b Bootstrap, ok bool) {
	switch {
	case e.Spec.Etcd.BootstrapWithExistingCluster != nil:
		for _, m := range e.Spec.Etcd.BootstrapWithExistingCluster.Members {
			b.Members = append(b.Members, v1alpha1.ExternalMember{Name: m.Name, PeerURLs: slices.Clone(m.PeerURLs)})
		}
		voters := max(int32(len(b.Members))-1, 1)
		b.LearnerReplicas = max(0, min(e.Spec.Replicas-voters, e.Spec.Replicas-1))
		return b, true
	case e.Status.BootstrapWithExistingCluster != nil && len(e.Status.BootstrapWithExistingCluster.Members) > 0:
		for _, m := range e.Status.BootstrapWithExistingCluster.Members {
			b.Members = append(b.Members, v1alpha1.ExternalMember{Name: m.Name, PeerURLs: slices.Clone(m.PeerURLs)})
		}
		b.Retire = true
		return b, true
	}
	return Bootstrap{}, false
}

// apply fills s from b where s leaves the field unset: a druid-stretch
// field that is set wins (and Conflicts reports one that contradicts b).
func (b Bootstrap) apply(s *v1alpha1.MembershipSpec) {
	if len(s.ExternalMembers) == 0 && s.ExternalMembersPolicy == nil {
		s.ExternalMembers = slices.Clone(b.Members)
		if b.Retire {
			s.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
		}
	}
	if s.LearnerReplicas == nil && b.LearnerReplicas > 0 {
		s.LearnerReplicas = ptr.To(b.LearnerReplicas)
	}
}

// strip removes from s what apply filled in from b, so that a View written
// back (Split, etcdview.Apply) does not copy druid's fields into the
// EtcdMembership, where they would outlive the druid field they came from.
func (b Bootstrap) strip(s *v1alpha1.MembershipSpec) {
	derived := v1alpha1.MembershipSpec{}
	b.apply(&derived)
	if equality.Semantic.DeepEqual(s.ExternalMembers, derived.ExternalMembers) && equality.Semantic.DeepEqual(s.ExternalMembersPolicy, derived.ExternalMembersPolicy) {
		s.ExternalMembers, s.ExternalMembersPolicy = nil, nil
	}
	if derived.LearnerReplicas != nil && equality.Semantic.DeepEqual(s.LearnerReplicas, derived.LearnerReplicas) {
		s.LearnerReplicas = nil
	}
}

// Own is v's membership spec without what the View derives from druid's
// bootstrap fields: what the EtcdMembership carries. A View changed by its
// caller may have changed those druid fields too (gardenlet unsetting
// spec.etcd.bootstrapWithExistingCluster): pass the Etcd it was viewed
// from as before, so that what the old fields derived is left out as well
// and does not outlive them in the EtcdMembership.
func Own(v *v1alpha1.Etcd, before ...*v1alpha1.Etcd) v1alpha1.MembershipSpec {
	s := *v.Spec.MembershipSpec.DeepCopy()
	for _, e := range append(before, v) {
		if e == nil {
			continue
		}
		if b, ok := FromBootstrap(e); ok {
			b.strip(&s)
		}
	}
	return s
}

// Conflicts are the contradictions between e's bootstrap fields and the
// membership spec s of druid-stretch's own object, each naming the field:
// external members other than the source's, a policy that disagrees with
// the bootstrap's state, or a source member named like one of e's own
// members. The controller plans nothing while there is one, and the
// EtcdMembership's webhook refuses a write that makes one.
func Conflicts(e *v1alpha1.Etcd, s *v1alpha1.MembershipSpec) field.ErrorList {
	b, ok := FromBootstrap(e)
	if !ok {
		return nil
	}
	var errs field.ErrorList
	src := field.NewPath("spec", "etcd", "bootstrapWithExistingCluster", "members")
	if b.Retire {
		src = field.NewPath("status", "bootstrapWithExistingCluster", "members")
	}
	for i, m := range b.Members {
		if members.IsLocal(e, m.Name) {
			errs = append(errs, field.Invalid(src.Index(i).Child("name"), m.Name,
				"the name of one of this Etcd's own members: the source's members and the Etcd's must have names apart (spec.memberNamePrefix)"))
		}
	}
	if len(s.ExternalMembers) > 0 {
		want := map[string][]string{}
		for _, m := range b.Members {
			want[m.Name] = m.PeerURLs
		}
		got := map[string]bool{}
		for i, x := range s.ExternalMembers {
			got[x.Name] = true
			urls, found := want[x.Name]
			switch {
			case !found:
				errs = append(errs, field.Invalid(field.NewPath("spec", "externalMembers").Index(i).Child("name"), x.Name,
					fmt.Sprintf("the Etcd's %s does not name this member: with GEP-39's fields set, external members are the source's, as listed there, or left out", src)))
			case !members.SameURLs(urls, x.PeerURLs):
				errs = append(errs, field.Invalid(field.NewPath("spec", "externalMembers").Index(i).Child("peerURLs"), x.PeerURLs,
					fmt.Sprintf("the Etcd's %s gives %s the peer URLs %v", src, x.Name, urls)))
			}
		}
		for _, m := range b.Members {
			if !got[m.Name] {
				errs = append(errs, field.Required(field.NewPath("spec", "externalMembers"),
					fmt.Sprintf("the Etcd's %s names %s, which is not listed here: list every source member or none", src, m.Name)))
			}
		}
	}
	if s.ExternalMembersPolicy != nil && (*s.ExternalMembersPolicy == v1alpha1.ExternalMembersPolicyRetire) != b.Retire {
		why := "the Etcd's spec.etcd.bootstrapWithExistingCluster is set, which keeps the source's members"
		if b.Retire {
			why = "the Etcd's spec.etcd.bootstrapWithExistingCluster is unset after the join, which retires the source's members"
		}
		errs = append(errs, field.Invalid(field.NewPath("spec", "externalMembersPolicy"), *s.ExternalMembersPolicy, why+": leave the policy unset"))
	}
	return errs
}
