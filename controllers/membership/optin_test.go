package membership_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// TestEtcdOfAManagedNamespaceIsOptedIn: an Etcd written in druid's form
// alone, as gardenlet writes a shoot's, in a namespace the controller's
// ManagedNamespaces selector matches, gets an EtcdMembership of
// ordinalStart 0 owned by the Etcd, and its running members converge with
// no membership change. The Etcd itself is not written.
func TestEtcdOfAManagedNamespaceIsOptedIn(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	ns := &corev1.Namespace{}
	g.Expect(k8s.Get(t.Context(), client.ObjectKey{Name: e.ns}, ns)).To(Succeed())
	ns.Labels = map[string]string{"gardener.cloud/role": "shoot"}
	g.Expect(k8s.Update(t.Context(), ns)).To(Succeed())

	etcd := etcdObject(e.ns, "ns", 3)
	etcd.Spec.OrdinalStart = nil
	g.Expect(k8s.Create(t.Context(), etcd)).To(Succeed())
	before := pair(g, etcd)
	g.Expect(before.Membership).To(BeNil(), "gardenlet writes no druid-stretch object")
	g.Expect(before.Source).To(Equal(stretchv1alpha1.SpecNone))

	optIn, err := etcdview.ParseNamespaceOptIn("gardener.cloud/role=shoot,gardener.cloud/purpose notin (exposureclass-handler)")
	g.Expect(err).NotTo(HaveOccurred())
	e.startController(func(o *membershipctrl.ManagerOptions) { o.Reconciler.ManagedNamespaces = optIn })
	converged(g, etcd, current, 90*time.Second, names("ns", 0, 1, 2)...)

	after := pair(g, etcd)
	g.Expect(after.Membership.Spec.MembershipSpec).To(Equal(v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](0)}))
	g.Expect(after.Membership.OwnerReferences).To(ConsistOf(stretchv1alpha1.OwnerReference(after.Etcd)))
	g.Expect(after.Source).To(Equal(stretchv1alpha1.SpecFromEtcdMembership), "written down: the selector may change later")
	g.Expect(after.Etcd.Generation).To(Equal(before.Etcd.Generation), "the Etcd's spec is not written")
	g.Expect(changes(e.calls.snapshot())).To(BeEmpty(), "opting a running cluster in changes no member")

	// The EtcdMembership deleted while the pods run on druid's own
	// ordinals: the opt-in changes nothing that runs, so it comes back.
	// (On any other pod window it is lost state: webhook.NamespaceMayOptIn,
	// and the webhook's TestLostExtensionFieldsKeepTheStatefulSet.)
	g.Expect(k8s.Delete(t.Context(), after.Membership)).To(Succeed())
	g.Eventually(func(g Gomega) {
		p := pair(g, etcd)
		g.Expect(p.Membership).NotTo(BeNil())
		g.Expect(p.Membership.UID).NotTo(Equal(after.Membership.UID))
		g.Expect(p.Membership.Spec.MembershipSpec).To(Equal(v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](0)}))
	}).WithTimeout(30 * time.Second).Should(Succeed())
	converged(g, etcd, current, 30*time.Second, names("ns", 0, 1, 2)...)
	g.Expect(reasons(events(g, etcd))).NotTo(HaveKey("ExtensionLost"))
	g.Expect(changes(e.calls.snapshot())).To(BeEmpty())
}
