package validation

import (
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// TestDroppingAVoterIsRefused: an external member that status shows as a
// voter may not leave spec.externalMembers while the Etcd has members of
// its own; it may once it left etcd, or when the Etcd gives the cluster up.
func TestDroppingAVoterIsRefused(t *testing.T) {
	withStatus := func(role v1alpha1.MemberRole) *v1alpha1.Etcd {
		e := stretchedEtcd()
		e.Status.Membership = &v1alpha1.MembershipStatus{Members: []v1alpha1.ObservedMember{
			{Name: "seed-b-etcd-main-0", Role: v1alpha1.MemberRoleLeader, Origin: v1alpha1.MemberOriginLocal},
			{Name: "seed-a-etcd-main-0", Role: role, Origin: v1alpha1.MemberOriginExternal},
		}}
		return e
	}
	for _, tc := range []struct {
		name     string
		old      *v1alpha1.Etcd
		replicas int32
		refused  bool
	}{
		{name: "a voter, the Etcd keeps its members", old: withStatus(v1alpha1.MemberRoleVoter), replicas: 3, refused: true},
		{name: "the leader", old: withStatus(v1alpha1.MemberRoleLeader), replicas: 3, refused: true},
		{name: "a learner", old: withStatus(v1alpha1.MemberRoleLearner), replicas: 3},
		{name: "no longer a member", old: observedWithoutExternal(), replicas: 3},
		{name: "a voter, the Etcd scaled to zero (a move's last step)", old: withStatus(v1alpha1.MemberRoleVoter), replicas: 0},
		{name: "never observed", old: stretchedEtcd(), replicas: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := tc.old.DeepCopy()
			e.Spec.Replicas = tc.replicas
			e.Spec.ExternalMembers = nil
			errs := validateNoOrphanedVoter(e, tc.old)
			if !tc.refused {
				g.Expect(errs).To(BeEmpty())
				return
			}
			g.Expect(errs).To(HaveLen(1))
			g.Expect(errs[0].Type).To(Equal(field.ErrorTypeForbidden))
			g.Expect(errs[0].Field).To(Equal("spec.externalMembers"))
			g.Expect(errs[0].Detail).To(And(ContainSubstring("seed-a-etcd-main-0"), ContainSubstring("Retire")), "the message names the member and the way out")
			g.Expect(ValidateEtcdUpdate(e, tc.old)).To(ContainElement(errs[0]), "the update validation applies it")
		})
	}
}

// observedWithoutExternal is baseEtcd whose status saw its own member
// only: the external one has left etcd.
func observedWithoutExternal() *v1alpha1.Etcd {
	e := stretchedEtcd()
	e.Status.Membership = &v1alpha1.MembershipStatus{Members: []v1alpha1.ObservedMember{
		{Name: "seed-b-etcd-main-0", Role: v1alpha1.MemberRoleLeader, Origin: v1alpha1.MemberOriginLocal},
	}}
	return e
}

// stretchedEtcd has three local members (prefix seed-b) and lists one
// member of the other cluster.
func stretchedEtcd() *v1alpha1.Etcd {
	e := &v1alpha1.Etcd{}
	e.Name, e.Namespace = "etcd-main", "shoot--p--s"
	e.Spec.MemberNamePrefix = ptr.To("seed-b")
	e.Spec.Replicas = 3
	e.Spec.ExternalMembers = []v1alpha1.ExternalMember{{
		Name:     "seed-a-etcd-main-0",
		PeerURLs: []string{"http://etcd-main-0.seed-a.example:2380"},
	}}
	return e
}
