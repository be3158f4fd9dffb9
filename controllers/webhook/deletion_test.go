package webhook_test

import (
	"fmt"
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// votersBeside is a status.membership that observed local voters of e (the
// first ordinals of its range, or of ordinalStart when it has no
// replicas) beside external voters (the first of its external members).
func votersBeside(e *v1alpha1.Etcd, local, external int) *v1alpha1.MembershipStatus {
	st := &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseConverged}
	start := int64(e.Spec.GetOrdinalStart())
	for i := range local {
		st.Members = append(st.Members, v1alpha1.ObservedMember{ID: fmt.Sprintf("a%d", i), Name: members.MemberName(e, start+int64(i)),
			Role: v1alpha1.MemberRoleVoter, Origin: v1alpha1.MemberOriginLocal, Healthy: true, CaughtUp: true})
	}
	for i := range external {
		st.Members = append(st.Members, v1alpha1.ObservedMember{ID: fmt.Sprintf("b%d", i), Name: e.Spec.ExternalMembers[i].Name,
			Role: v1alpha1.MemberRoleVoter, Origin: v1alpha1.MemberOriginExternal, Healthy: true, CaughtUp: true})
	}
	return st
}

// expectDeleteRefused deletes obj and expects the webhook's denial naming
// want, with obj still stored as it was.
func expectDeleteRefused(t *testing.T, obj client.Object, want ...string) {
	t.Helper()
	g := NewWithT(t)
	before := obj.DeepCopyObject().(client.Object)
	g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(obj), before)).To(Succeed())
	err := k8s.Delete(t.Context(), obj)
	g.Expect(err).To(HaveOccurred(), "the deletion was admitted")
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a webhook denial: %v", err)
	for _, w := range want {
		g.Expect(err.Error()).To(ContainSubstring(w))
	}
	after := obj.DeepCopyObject().(client.Object)
	g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(obj), after)).To(Succeed(), "still stored")
	g.Expect(after.GetResourceVersion()).To(Equal(before.GetResourceVersion()), "unchanged")
	g.Expect(after.GetDeletionTimestamp()).To(BeNil(), "not being deleted")
}

// expectDeleted deletes obj and expects it gone.
func expectDeleted(t *testing.T, obj client.Object) {
	t.Helper()
	g := NewWithT(t)
	g.Expect(k8s.Delete(t.Context(), obj)).To(Succeed())
	err := k8s.Get(t.Context(), client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "deleted: %v", err)
}

// One side of a stretched cluster (a move half done: 3 local voters, 2 of
// the other side's) is neither deleted nor loses its EtcdMembership, and
// the refusal names the voters and the way out.
func TestStretchedEtcdIsNotDeleted(t *testing.T) {
	g := NewWithT(t)
	e := createEtcd(t, stretchedEtcd(newNamespace(t)))
	setMembershipStatus(t, e, votersBeside(e, 3, 2))
	before := webhookRequests(t, webhook.EtcdDeletionValidatorPath)

	expectDeleteRefused(t, &v1alpha1.Etcd{ObjectMeta: e.ObjectMeta}, "seed-b-etcd-main-3, seed-b-etcd-main-4, seed-b-etcd-main-5",
		"seed-a-etcd-main-0, seed-a-etcd-main-1", "lose their quorum", webhook.DeleteStretchedAnnotation)
	g.Expect(webhookRequests(t, webhook.EtcdDeletionValidatorPath)).To(Equal(before+1), "judged by the deletion validator")
	expectDeleteRefused(t, stretchv1alpha1.For(e, v1alpha1.MembershipSpec{}), "EtcdMembership", "seed-b-etcd-main-3", webhook.DeleteStretchedAnnotation)

	p, err := etcdview.Get(t.Context(), k8s, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.View.UsesExtension()).To(BeTrue(), "the pair is as it was")
	g.Expect(p.View.Status.Membership.Voters()).To(HaveLen(5))
}

// What stays admitted: an Etcd that is not stretched, one scaled to zero
// whose members left, a finished move's source whose last observation
// predates its last member's removal, a deletion on purpose, and the
// EtcdMembership of an Etcd that is gone or going.
func TestEtcdDeletionsStillAdmitted(t *testing.T) {
	t.Run("not stretched", func(t *testing.T) {
		e := etcdWithTLS(newNamespace(t))
		e.Spec.OrdinalStart = ptr.To[int32](0)
		e = createEtcd(t, e)
		setMembershipStatus(t, e, votersBeside(e, 3, 0))
		expectDeleted(t, &v1alpha1.Etcd{ObjectMeta: e.ObjectMeta})
		expectDeleted(t, stretchv1alpha1.For(e, v1alpha1.MembershipSpec{}))
	})
	t.Run("druid's alone", func(t *testing.T) {
		e := createEtcd(t, etcdWithTLS(newNamespace(t)))
		expectDeleted(t, &v1alpha1.Etcd{ObjectMeta: e.ObjectMeta})
	})
	t.Run("scaled to zero, its members removed", func(t *testing.T) {
		e := stretchedEtcd(newNamespace(t))
		e.Spec.Replicas = 0
		e = createEtcd(t, e)
		setMembershipStatus(t, e, votersBeside(e, 0, 3))
		expectDeleted(t, &v1alpha1.Etcd{ObjectMeta: e.ObjectMeta})
	})
	t.Run("a finished move's source, last observed with one member left", func(t *testing.T) {
		// GEP-39's SourceSeedCleanup: the source scaled to zero, its
		// controller's last observation from before the destination
		// removed its last member.
		e := etcdWithTLS(newNamespace(t))
		e.Spec.OrdinalStart, e.Spec.Replicas = ptr.To[int32](0), 0
		e = createEtcd(t, e)
		st := votersBeside(e, 1, 0)
		for i := range 3 {
			st.Members = append(st.Members, v1alpha1.ObservedMember{ID: fmt.Sprintf("c%d", i), Name: fmt.Sprintf("seed-c-etcd-main-%d", i),
				Role: v1alpha1.MemberRoleVoter, Origin: v1alpha1.MemberOriginUnmanaged, Healthy: true})
		}
		setMembershipStatus(t, e, st)
		expectDeleted(t, &v1alpha1.Etcd{ObjectMeta: e.ObjectMeta})
	})
	t.Run("on purpose", func(t *testing.T) {
		g := NewWithT(t)
		e := createEtcd(t, stretchedEtcd(newNamespace(t)))
		setMembershipStatus(t, e, votersBeside(e, 3, 2))
		e = changeEtcd(t, e, func(v *v1alpha1.Etcd) {
			v.Annotations = map[string]string{webhook.DeleteStretchedAnnotation: "true"}
		})
		// A finalizer holds the Etcd while it is being deleted, as druid's
		// does: its EtcdMembership goes meanwhile, as the garbage
		// collector deletes it in the foreground.
		stored := &v1alpha1.Etcd{}
		g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), stored)).To(Succeed())
		stored.Finalizers = []string{"druid.gardener.cloud/etcd-druid"}
		g.Expect(k8s.Update(t.Context(), stored)).To(Succeed())
		g.Expect(k8s.Delete(t.Context(), stored)).To(Succeed())
		g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), stored)).To(Succeed())
		g.Expect(stored.DeletionTimestamp).NotTo(BeNil())
		expectDeleted(t, stretchv1alpha1.For(e, v1alpha1.MembershipSpec{}))
		stored.Finalizers = nil
		g.Expect(k8s.Update(t.Context(), stored)).To(Succeed())
		err := k8s.Get(t.Context(), client.ObjectKeyFromObject(e), stored)
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "deleted: %v", err)
	})
	t.Run("the EtcdMembership of a stretched Etcd on purpose", func(t *testing.T) {
		g := NewWithT(t)
		e := createEtcd(t, stretchedEtcd(newNamespace(t)))
		setMembershipStatus(t, e, votersBeside(e, 3, 2))
		m, err := etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(e))
		g.Expect(err).NotTo(HaveOccurred())
		m.Annotations = map[string]string{webhook.DeleteStretchedAnnotation: "true"}
		g.Expect(k8s.Update(t.Context(), m)).To(Succeed())
		expectDeleted(t, m)
	})
}

// Where nothing has observed the members yet (status.membership missing,
// or listing no member), an Etcd whose spec says it could be stretched is
// neither deleted nor loses its EtcdMembership: the refusal says what is
// unknown, why it matters and what to do. Each case is refused first; the
// override then deletes it on purpose.
func TestUnobservedStretchedEtcdIsNotDeleted(t *testing.T) {
	gep39 := func(ns string) *v1alpha1.Etcd {
		// GEP-39's destination, created with druid's fields alone: no
		// EtcdMembership until its controller adopts it.
		e := etcdWithTLS(ns)
		b := &druidv1alpha1.BootstrapWithExistingCluster{ClientEndpoints: []string{"https://etcd-main-client.seed-a.example:2379"}}
		for _, x := range stretchedEtcd(ns).Spec.ExternalMembers {
			b.Members = append(b.Members, druidv1alpha1.BootstrapExistingMember{Name: x.Name, PeerURLs: x.PeerURLs})
		}
		e.Spec.Etcd.BootstrapWithExistingCluster = b
		return e
	}
	for _, tc := range []struct {
		name   string
		build  func(ns string) *v1alpha1.Etcd
		status *v1alpha1.MembershipStatus
		want   []string
	}{
		{"a destination with external members, not observed yet", stretchedEtcd, nil,
			[]string{"status.membership is missing", "it lists 3 external member(s) beside its 3 replicas", "ordinals from 3"}},
		{"on ordinals from 3, observed with no member", func(ns string) *v1alpha1.Etcd {
			e := stretchedEtcd(ns)
			e.Spec.ExternalMembers = nil
			return e
		}, &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhasePending},
			[]string{`status.membership lists no member (phase "Pending")`, "ordinals from 3"}},
		{"GEP-39's destination, no EtcdMembership yet", gep39, nil,
			[]string{"status.membership is missing", "spec.etcd.bootstrapWithExistingCluster names 3 member(s)", `prefix "seed-b"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := createEtcd(t, tc.build(newNamespace(t)))
			if tc.status != nil {
				setMembershipStatus(t, e, tc.status)
			}
			want := append(tc.want, "kubectl get etcdmembership etcd-main -n "+e.Namespace+" -o yaml", webhook.DeleteStretchedAnnotation)
			expectDeleteRefused(t, &v1alpha1.Etcd{ObjectMeta: e.ObjectMeta}, want...)
			m, err := etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(e))
			g.Expect(err).NotTo(HaveOccurred())
			if m != nil {
				expectDeleteRefused(t, m, append(want, "deleting the EtcdMembership")...)
			}

			e = changeEtcd(t, e, func(v *v1alpha1.Etcd) {
				v.Annotations = map[string]string{webhook.DeleteStretchedAnnotation: "true"}
			})
			expectDeleted(t, &v1alpha1.Etcd{ObjectMeta: e.ObjectMeta})
		})
	}
}

// What stays admitted while nothing has observed the members: an Etcd
// opted in on druid's own ordinals with nothing that could stretch it, its
// EtcdMembership, and an Etcd already being deleted (deleted again, and its
// EtcdMembership deleted meanwhile, as the garbage collector does).
func TestUnobservedEtcdDeletionsStillAdmitted(t *testing.T) {
	plain := func(ns string) *v1alpha1.Etcd {
		e := etcdWithTLS(ns)
		e.Spec.OrdinalStart, e.Spec.MemberNamePrefix = ptr.To[int32](0), nil
		return e
	}
	t.Run("opted in on druid's own ordinals", func(t *testing.T) {
		e := createEtcd(t, plain(newNamespace(t)))
		expectDeleted(t, &v1alpha1.Etcd{ObjectMeta: e.ObjectMeta})
	})
	t.Run("the EtcdMembership of one opted in on druid's own ordinals", func(t *testing.T) {
		e := createEtcd(t, plain(newNamespace(t)))
		expectDeleted(t, stretchv1alpha1.For(e, v1alpha1.MembershipSpec{}))
	})
	t.Run("already being deleted", func(t *testing.T) {
		g := NewWithT(t)
		e := createEtcd(t, stretchedEtcd(newNamespace(t)))
		stored := &v1alpha1.Etcd{}
		g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), stored)).To(Succeed())
		stored.Finalizers = []string{"druid.gardener.cloud/etcd-druid"}
		stored.Annotations = map[string]string{webhook.DeleteStretchedAnnotation: "true"}
		g.Expect(k8s.Update(t.Context(), stored)).To(Succeed())
		g.Expect(k8s.Delete(t.Context(), stored)).To(Succeed())
		g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), stored)).To(Succeed())
		g.Expect(stored.DeletionTimestamp).NotTo(BeNil())
		stored.Annotations = nil
		g.Expect(k8s.Update(t.Context(), stored)).To(Succeed())
		g.Expect(k8s.Delete(t.Context(), stored)).To(Succeed(), "deleted again without the override")
		expectDeleted(t, stretchv1alpha1.For(e, v1alpha1.MembershipSpec{}))
		g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), stored)).To(Succeed())
		stored.Finalizers = nil
		g.Expect(k8s.Update(t.Context(), stored)).To(Succeed())
		err := k8s.Get(t.Context(), client.ObjectKeyFromObject(e), stored)
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "deleted: %v", err)
	})
}

// An Etcd whose pods run on druid-stretch's pod window and whose status
// observed its own voters only keeps its EtcdMembership: only the lost
// fields refuse the deletion, and that refusal names the override too,
// with which the deletion goes.
func TestObservedEtcdOnItsPodWindowKeepsItsFields(t *testing.T) {
	g := NewWithT(t)
	e := etcdWithTLS(newNamespace(t))
	e.Spec.OrdinalStart = ptr.To[int32](3)
	e = createEtcd(t, e)
	withStatefulSet(t, k8s, e)
	setMembershipStatus(t, e, votersBeside(e, 3, 0))

	m := stretchv1alpha1.For(e, v1alpha1.MembershipSpec{})
	expectDeleteRefused(t, m, "pod window [3, 6) from ordinal 3", "without druid-stretch's fields", webhook.DeleteStretchedAnnotation)
	stored, err := etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	stored.Annotations = map[string]string{webhook.DeleteStretchedAnnotation: "true"}
	g.Expect(k8s.Update(t.Context(), stored)).To(Succeed())
	expectDeleted(t, stored)
}
