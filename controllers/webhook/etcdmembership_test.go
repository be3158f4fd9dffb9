package webhook_test

import (
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// midMove is the status a destination's controller reports while it
// retires the source: the external members still vote.
func midMove(e *v1alpha1.Etcd) *v1alpha1.MembershipStatus {
	st := &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseReconfiguring}
	for i, x := range e.Spec.ExternalMembers {
		st.Members = append(st.Members, v1alpha1.ObservedMember{ID: string(rune('1' + i)), Name: x.Name,
			Role: v1alpha1.MemberRoleVoter, Origin: v1alpha1.MemberOriginExternal, Healthy: true})
	}
	return st
}

// Under druid's own Etcd CRD, the changes of an EtcdMembership that the
// pair's rules refuse are refused by its webhook, judged with the stored
// Etcd, and neither object changes: the transitions a move must not make
// and the names only the pair can check.
func TestEtcdMembershipValidatorRefusesThePairsRules(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status bool
		change func(*v1alpha1.Etcd)
		field  string
		detail string
	}{
		{"the ordinal range moved by more than replicas", false,
			func(v *v1alpha1.Etcd) { v.Spec.OrdinalStart = ptr.To[int32](10) },
			"spec.ordinalStart", "may move by at most spec.replicas (3) at a time"},
		{"Retire back to Keep while external members still vote", true,
			func(v *v1alpha1.Etcd) { v.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyKeep) },
			"spec.externalMembersPolicy", "may change from Retire to Keep only once"},
		{"an external member that votes dropped", true,
			func(v *v1alpha1.Etcd) { v.Spec.ExternalMembers = v.Spec.ExternalMembers[1:] },
			"spec.externalMembers", "a voter of the etcd cluster"},
		{"an external member named like a local member", false,
			func(v *v1alpha1.Etcd) { v.Spec.ExternalMembers[2].Name = "seed-b-etcd-main-4" },
			"spec.externalMembers[2].name", "seed-b-etcd-main-4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := stretchedEtcd(newNamespace(t))
			e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
			createEtcd(t, e)
			if tc.status {
				setMembershipStatus(t, e, midMove(e))
			}
			key := client.ObjectKeyFromObject(e)
			before, err := etcdview.Get(t.Context(), k8s, key)
			g.Expect(err).NotTo(HaveOccurred())
			want := before.View.DeepCopy()
			tc.change(want)
			err = etcdview.Apply(t.Context(), k8s, etcdview.Of(before.Etcd.DeepCopy(), before.Membership.DeepCopy()), want)
			expectRefused(t, err, tc.field, false)
			g.Expect(err.Error()).To(ContainSubstring(`admission webhook "etcdmemberships.druid-stretch.druid.gardener.cloud" denied the request`))
			g.Expect(err.Error()).To(ContainSubstring(tc.detail))
			g.Expect(err.Error()).To(ContainSubstring("judged with the Etcd " + key.String()))
			after, err := etcdview.Get(t.Context(), k8s, key)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(after.Membership.ResourceVersion).To(Equal(before.Membership.ResourceVersion), "the EtcdMembership did not change")
			g.Expect(after.Etcd.ResourceVersion).To(Equal(before.Etcd.ResourceVersion), "the Etcd did not change")
			g.Expect(equality.Semantic.DeepEqual(after.View.Spec, before.View.Spec)).To(BeTrue())
		})
	}
}

// What a move writes passes: the EtcdMembership before its Etcd (judged
// once the Etcd exists), the retirement, and the abort, which scales the
// Etcd to zero and turns Retire back to Keep in the middle of the move
// (written Etcd first, so that the EtcdMembership's change is judged with
// the Etcd it goes with).
func TestEtcdMembershipValidatorAdmitsAMovesWrites(t *testing.T) {
	g := NewWithT(t)
	e := stretchedEtcd(newNamespace(t))
	before := webhookRequests(t, webhook.EtcdMembershipValidatorPath)
	createEtcd(t, e)
	g.Expect(webhookRequests(t, webhook.EtcdMembershipValidatorPath)).To(BeNumerically(">", before), "the EtcdMembership's create was judged")

	changeEtcd(t, e, func(v *v1alpha1.Etcd) {
		v.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
	})
	setMembershipStatus(t, e, midMove(e))
	aborted := changeEtcd(t, e, func(v *v1alpha1.Etcd) {
		v.Spec.Replicas = 0
		v.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyKeep)
	})
	p, err := etcdview.Get(t.Context(), k8s, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Etcd.Spec.Replicas).To(BeZero())
	g.Expect(p.Membership.Spec.ExternalMembersPolicy).To(HaveValue(Equal(v1alpha1.ExternalMembersPolicyKeep)))
	g.Expect(p.View.Spec.ExternalMembers).To(Equal(aborted.Spec.ExternalMembers), "the abort keeps the external members listed")
	g.Expect(p.Source).To(Equal(stretchv1alpha1.SpecFromEtcdMembership))
}

// A warm destination gets its learners and its final replicas in one step:
// the EtcdMembership (learnerReplicas 2) is written first and judged with
// the replicas the Etcd is written to right after, which its write names
// (stretchv1alpha1.PairedReplicasAnnotation). The same change without that
// name, or with one left from an earlier write, is judged with the stored
// Etcd and refused, and nothing changes.
func TestEtcdMembershipValidatorJudgesAPairedWriteWithItsReplicas(t *testing.T) {
	g := NewWithT(t)
	e := stretchedEtcd(newNamespace(t))
	e.Spec.Replicas = 1
	createEtcd(t, e)
	key := client.ObjectKeyFromObject(e)

	// By hand: the EtcdMembership alone, as kubectl would write it.
	m, err := etcdview.GetMembership(t.Context(), k8s, key)
	g.Expect(err).NotTo(HaveOccurred())
	alone := m.DeepCopy()
	alone.Spec.LearnerReplicas = ptr.To[int32](2)
	expectRefused(t, k8s.Update(t.Context(), alone), "spec.learnerReplicas", false)
	stale := m.DeepCopy()
	stale.Annotations = map[string]string{stretchv1alpha1.PairedReplicasAnnotation: "3/1"}
	g.Expect(k8s.Update(t.Context(), stale)).To(Succeed(), "an annotation alone changes nothing the rules read")
	stale.Spec.LearnerReplicas = ptr.To[int32](2)
	expectRefused(t, k8s.Update(t.Context(), stale), "spec.learnerReplicas", false)
	after, err := etcdview.GetMembership(t.Context(), k8s, key)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.Spec.LearnerReplicas).To(BeNil(), "nothing of the refused changes was stored")

	// As a move writes it: both parts, the EtcdMembership first.
	changeEtcd(t, e, func(v *v1alpha1.Etcd) {
		v.Spec.Replicas = 3
		v.Spec.LearnerReplicas = ptr.To[int32](2)
	})
	p, err := etcdview.Get(t.Context(), k8s, key)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Etcd.Spec.Replicas).To(BeNumerically("==", 3))
	g.Expect(p.Membership.Spec.LearnerReplicas).To(HaveValue(BeNumerically("==", 2)))
	g.Expect(p.Membership.Annotations).To(HaveKeyWithValue(stretchv1alpha1.PairedReplicasAnnotation, HavePrefix("3/")))
}
