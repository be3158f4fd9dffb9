package webhook_test

import (
	"testing"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// statusWriter is the identity the tests' webhook lets write
// status.membership besides its own (--membership-status-writers).
const statusWriter = "system:serviceaccount:garden:druid-stretch-operator"

// clientAs is a client of k8s's API server that impersonates user, with
// every permission (system:masters): only the webhook stands in its way.
func clientAs(t *testing.T, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(k8sConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:masters"}}
	c, err := client.New(cfg, client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writeMembershipStatus writes st as status.membership of e's
// EtcdMembership through c, and returns the API server's answer.
func writeMembershipStatus(t *testing.T, c client.Client, e *v1alpha1.Etcd, st *v1alpha1.MembershipStatus) error {
	t.Helper()
	m, err := etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(e))
	if err != nil {
		return err
	}
	m.Status.Membership = st.DeepCopy()
	return c.Status().Update(t.Context(), m)
}

// storedMembershipStatus is status.membership of e's EtcdMembership as
// stored, and the object's resourceVersion.
func storedMembershipStatus(t *testing.T, e *v1alpha1.Etcd) (*v1alpha1.MembershipStatus, string) {
	t.Helper()
	m, err := etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(e))
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return m.Status.Membership, m.ResourceVersion
}

// status.membership unlocks spec transitions (Retire to Keep once
// Converged), so only the controller (the webhook's own identity) and the
// configured writers may change it: a user's forged Converged is refused
// and the transition stays refused; the controller's own writes, a
// configured writer's and a user's write that leaves status.membership as
// it is are admitted.
func TestMembershipStatusIsTheControllers(t *testing.T) {
	ns := newNamespace(t)
	e := stretchedEtcd(ns)
	e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
	createEtcd(t, e)
	reconfiguring := &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseReconfiguring}
	converged := &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseConverged}
	user := clientAs(t, "alice")
	keep := func(c client.Client) error {
		p, err := etcdview.Get(t.Context(), c, client.ObjectKeyFromObject(e))
		if err != nil {
			return err
		}
		v := p.View.DeepCopy()
		v.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyKeep)
		return etcdview.Apply(t.Context(), c, p, v)
	}

	g := NewWithT(t)
	g.Expect(writeMembershipStatus(t, k8s, e, reconfiguring)).To(Succeed(), "the controller's own write")

	err := writeMembershipStatus(t, user, e, converged)
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a user's forged status: %v", err)
	g.Expect(err).To(MatchError(ContainSubstring(`not by "alice"`)))
	st, _ := storedMembershipStatus(t, e)
	g.Expect(st.Phase).To(Equal(v1alpha1.MembershipPhaseReconfiguring))
	g.Expect(keep(user)).To(MatchError(ContainSubstring("spec.externalMembersPolicy")), "Retire to Keep stays refused")

	// A status write that leaves status.membership as it is: a condition.
	m, err := etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: "Reviewed", Status: metav1.ConditionTrue, Reason: "ByHand", Message: "looked at it"})
	g.Expect(user.Status().Update(t.Context(), m)).To(Succeed())

	g.Expect(writeMembershipStatus(t, clientAs(t, statusWriter), e, reconfiguring.DeepCopy())).To(Succeed(), "a configured writer")
	g.Expect(writeMembershipStatus(t, k8s, e, converged)).To(Succeed(), "the controller's own write")
	st, _ = storedMembershipStatus(t, e)
	g.Expect(st.Phase).To(Equal(v1alpha1.MembershipPhaseConverged))
	g.Expect(keep(user)).To(Succeed(), "Retire to Keep once the controller reports Converged")
	p, err := etcdview.Get(t.Context(), k8s, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.View.Spec.GetExternalMembersPolicy()).To(Equal(v1alpha1.ExternalMembersPolicyKeep))
}
