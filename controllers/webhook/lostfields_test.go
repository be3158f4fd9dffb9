package webhook_test

import (
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// dropFieldsOnPurpose deletes e's EtcdMembership the one way admission
// lets a live Etcd lose druid-stretch's fields (the deliberate override),
// and returns the pair's view afterwards, which uses none of them.
func dropFieldsOnPurpose(t *testing.T, e *v1alpha1.Etcd) *v1alpha1.Etcd {
	t.Helper()
	g := NewWithT(t)
	m, err := etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	m.Annotations = map[string]string{webhook.DeleteStretchedAnnotation: "true"}
	g.Expect(k8s.Update(t.Context(), m)).To(Succeed())
	g.Expect(k8s.Delete(t.Context(), m)).To(Succeed())
	p, err := etcdview.Get(t.Context(), k8s, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.View.UsesExtension()).To(BeFalse())
	return p.View
}

// withStatefulSet creates e's pair and druid's StatefulSet of it, put on
// its pod window by the StatefulSet webhook, and returns the StatefulSet.
func withStatefulSet(t *testing.T, c client.Client, e *v1alpha1.Etcd) *appsv1.StatefulSet {
	t.Helper()
	g := NewWithT(t)
	g.Expect(c.Create(t.Context(), druidStatefulSet(e))).To(Succeed())
	sts := &appsv1.StatefulSet{}
	g.Expect(c.Get(t.Context(), client.ObjectKeyFromObject(e), sts)).To(Succeed())
	return sts
}

// expectPairKept expects the pair of e as before (its Etcd and
// EtcdMembership not written) and the StatefulSet sts unchanged.
func expectPairKept(t *testing.T, before *etcdview.Pair, sts *appsv1.StatefulSet) {
	t.Helper()
	g := NewWithT(t)
	after, err := etcdview.Get(t.Context(), k8s, client.ObjectKeyFromObject(before.Etcd))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.Etcd.ResourceVersion).To(Equal(before.Etcd.ResourceVersion))
	g.Expect(after.Membership).NotTo(BeNil(), "the EtcdMembership is still stored")
	g.Expect(after.Membership.ResourceVersion).To(Equal(before.Membership.ResourceVersion))
	g.Expect(after.View.UsesExtension()).To(BeTrue())
	stored := &appsv1.StatefulSet{}
	g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(sts), stored)).To(Succeed())
	g.Expect(stored.ResourceVersion).To(Equal(sts.ResourceVersion))
}

// Today's lost state (docs/reliability.md): the fields go, the controller
// reports ExtensionLost and the StatefulSet webhook refuses druid's writes,
// but a StatefulSet druid creates anew is put on druid's ordinals without
// the sidecar. So a write that drops the fields of an Etcd whose pods run
// on druid-stretch's pod window, or of one in the middle of a move, is
// refused at admission: deleting its EtcdMembership, emptying it, or
// removing the inline fields of an Etcd of the extended CRD that no
// EtcdMembership carries yet.
func TestDroppingTheFieldsOfALiveEtcdIsRefused(t *testing.T) {
	onWindow := func(ns string) *v1alpha1.Etcd {
		e := etcdWithTLS(ns)
		e.Spec.OrdinalStart = ptr.To[int32](3)
		return e
	}
	for _, tc := range []struct {
		name  string
		build func(ns string) *v1alpha1.Etcd
		drop  func(t *testing.T, p *etcdview.Pair) error
		want  []string
	}{
		{"its EtcdMembership deleted, pods on [3, 6)", onWindow,
			func(t *testing.T, p *etcdview.Pair) error { return k8s.Delete(t.Context(), p.Membership.DeepCopy()) },
			// A deletion's refusal names the override that deletes on purpose.
			[]string{"pod window [3, 6) from ordinal 3", "not on druid's own ordinals [0, 3)", webhook.DeleteStretchedAnnotation}},
		{"its EtcdMembership emptied, pods on [3, 6)", onWindow,
			func(t *testing.T, p *etcdview.Pair) error {
				m := p.Membership.DeepCopy()
				m.Spec = stretchv1alpha1.EtcdMembershipSpec{}
				return k8s.Update(t.Context(), m)
			},
			[]string{"pod window [3, 6)", "spec: Forbidden"}},
		{"its EtcdMembership deleted, hibernated from ordinal 3", func(ns string) *v1alpha1.Etcd {
			e := onWindow(ns)
			e.Spec.Replicas = 0
			return e
		}, func(t *testing.T, p *etcdview.Pair) error { return k8s.Delete(t.Context(), p.Membership.DeepCopy()) },
			[]string{"pod window [] from ordinal 3", webhook.DeleteStretchedAnnotation}},
		{"its EtcdMembership emptied mid-move, on druid's ordinals", func(ns string) *v1alpha1.Etcd {
			e := stretchedEtcd(ns)
			e.Spec.OrdinalStart = ptr.To[int32](0)
			return e
		}, func(t *testing.T, p *etcdview.Pair) error {
			m := p.Membership.DeepCopy()
			m.Spec = stretchv1alpha1.EtcdMembershipSpec{}
			return k8s.Update(t.Context(), m)
		}, []string{"it lists 3 external member(s) beside its 3 replicas"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := createEtcd(t, tc.build(newNamespace(t)))
			sts := withStatefulSet(t, k8s, e)
			p, err := etcdview.Get(t.Context(), k8s, client.ObjectKeyFromObject(e))
			g.Expect(err).NotTo(HaveOccurred())
			err = tc.drop(t, p)
			g.Expect(err).To(HaveOccurred(), "the fields were dropped")
			for _, w := range append(tc.want, "without druid-stretch's fields", "spec.ordinalStart 0") {
				g.Expect(err.Error()).To(ContainSubstring(w))
			}
			expectPairKept(t, p, sts)
		})
	}

	t.Run("the inline fields of an extended-CRD Etcd no EtcdMembership carries", func(t *testing.T) {
		g := NewWithT(t)
		ext := extended.client(t)
		e := onWindow(namespaceIn(t, ext))
		g.Expect(ext.Create(t.Context(), e)).To(Succeed())
		sts := withStatefulSet(t, ext, e)
		g.Expect(sts.Spec.Ordinals).To(Equal(&appsv1.StatefulSetOrdinals{Start: 3}))
		before := &v1alpha1.Etcd{}
		g.Expect(ext.Get(t.Context(), client.ObjectKeyFromObject(e), before)).To(Succeed())
		pruned := before.DeepCopy()
		pruned.Spec.MembershipSpec = v1alpha1.MembershipSpec{}
		err := ext.Update(t.Context(), pruned)
		g.Expect(err).To(MatchError(And(ContainSubstring("pod window [3, 6)"), ContainSubstring("without druid-stretch's fields"))))
		after := &v1alpha1.Etcd{}
		g.Expect(ext.Get(t.Context(), client.ObjectKeyFromObject(e), after)).To(Succeed())
		g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))
		g.Expect(equality.Semantic.DeepEqual(after.Spec, before.Spec)).To(BeTrue())

		// Once its EtcdMembership carries them (the controller's Adopt),
		// the inline copy goes as the upgrade removes it.
		g.Expect(ext.Create(t.Context(), stretchv1alpha1.For(before, before.Spec.MembershipSpec))).To(Succeed())
		g.Expect(ext.Update(t.Context(), pruned)).To(Succeed())
		p, err := etcdview.Get(t.Context(), ext, client.ObjectKeyFromObject(e))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(p.Etcd.Spec.OrdinalStart).To(BeNil())
		g.Expect(p.View.Spec.OrdinalStart).To(HaveValue(BeNumerically("==", 3)))
	})
}

// What stays admitted: the moves' own writes (the ordinal range moved
// back to 0, the finish), and dropping the fields of an Etcd that runs on
// druid's own ordinals and takes part in no move (the abort is in
// TestEtcdMembershipValidatorAdmitsAMovesWrites).
func TestDroppingTheFieldsStillAdmitted(t *testing.T) {
	t.Run("a move's own writes", func(t *testing.T) {
		g := NewWithT(t)
		e := createEtcd(t, stretchedEtcd(newNamespace(t)))
		withStatefulSet(t, k8s, e)
		changeEtcd(t, e, func(v *v1alpha1.Etcd) { v.Spec.OrdinalStart = ptr.To[int32](0) })
		changeEtcd(t, e, func(v *v1alpha1.Etcd) {
			v.Spec.ExternalMembers, v.Spec.ExternalMembersPolicy = nil, ptr.To(v1alpha1.ExternalMembersPolicyKeep)
		})
		p, err := etcdview.Get(t.Context(), k8s, client.ObjectKeyFromObject(e))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(p.View.Spec.ExternalMembers).To(BeEmpty())
		g.Expect(p.View.Spec.GetOrdinalStart()).To(BeZero())
		g.Expect(p.View.UsesExtension()).To(BeTrue(), "the finish keeps policy Keep")
	})
	t.Run("on druid's own ordinals, no move", func(t *testing.T) {
		g := NewWithT(t)
		e := etcdWithTLS(newNamespace(t))
		e.Spec.OrdinalStart = ptr.To[int32](0)
		e = createEtcd(t, e)
		sts := withStatefulSet(t, k8s, e)
		g.Expect(sts.Annotations).To(HaveKeyWithValue(webhook.PodWindowAnnotation, "[0, 3)"))
		// Observed with its own members alone: unobserved, its member name
		// prefix alone would keep the EtcdMembership.
		setMembershipStatus(t, e, votersBeside(e, 3, 0))
		expectDeleted(t, stretchv1alpha1.For(e, v1alpha1.MembershipSpec{}))
	})
}
