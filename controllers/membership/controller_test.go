package membership_test

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

func names(prefix string, ordinals ...int) []string {
	out := make([]string, len(ordinals))
	for i, o := range ordinals {
		out[i] = fmt.Sprintf("%s-etcd-main-%d", prefix, o)
	}
	return out
}

// TestMoveOrdinalsLive moves a running 3-member Etcd from ordinals 0-2 to
// 3-5: one learner at a time, each promoted before a departing member goes,
// leadership moved once, never more than 4 members.
func TestMoveOrdinalsLive(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	etcd := e.newEtcd("mv", 3)
	sts := druidStatefulSet(g, etcd)
	e.startController()
	converged(g, etcd, current, 90*time.Second, names("mv", 0, 1, 2)...)
	g.Eventually(podWindow(sts)).WithTimeout(10*time.Second).Should(Equal("[0, 3)"), "the StatefulSet follows the pod window")
	g.Expect(changes(e.calls.snapshot())).To(BeEmpty(), "a cluster bootstrapped as desired needs no change")

	removes := counter(g, "druid_stretch_membership_steps_total", map[string]string{"kind": "Remove", "outcome": "Succeeded"})
	catchUps, catchUpSum := histogram(g, "druid_stretch_membership_learner_catch_up_seconds")
	start := time.Now()
	gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.OrdinalStart = ptr.To[int32](3) })
	st := converged(g, etcd, gen, 3*time.Minute, names("mv", 3, 4, 5)...)
	took := time.Since(start)

	calls := e.calls.snapshot()
	g.Expect(memberCounts(3, calls)).To(Equal([]int{3, 4, 3, 4, 3, 4, 3}), "interleaved: never 5 or 6 members")
	g.Expect(count(calls)).To(Equal(map[string]int{"AddLearner": 3, "Promote": 3, "MoveLeader": 1, "Remove": 3}))
	g.Expect(st.RetiredMembers).To(ConsistOf(names("mv", 0, 1, 2)))
	g.Expect(st.LastStep).NotTo(BeNil())
	g.Expect(st.LastStep.Kind).To(Equal(v1alpha1.StepRemoveMember))
	for _, m := range st.Members {
		g.Expect(m.Origin).To(Equal(v1alpha1.MemberOriginLocal))
		g.Expect(m.Healthy).To(BeTrue())
	}
	g.Expect(condition(g, etcd, v1alpha1.ConditionMembershipProgressing).Status).To(Equal(metav1.ConditionFalse))
	g.Expect(condition(g, etcd, v1alpha1.ConditionMembershipDegraded).Status).To(Equal(metav1.ConditionFalse))
	g.Eventually(func(g Gomega) {
		r := reasons(events(g, etcd))
		g.Expect(r).To(HaveKeyWithValue("LearnerAdded", 3))
		g.Expect(r).To(HaveKeyWithValue("LearnerPromoted", 3))
		g.Expect(r).To(HaveKeyWithValue("LeaderMoved", 1))
		g.Expect(r).To(HaveKeyWithValue("MemberRemoved", 3))
		g.Expect(r).To(HaveKey("PodWindowMoved"))
	}).WithTimeout(10 * time.Second).Should(Succeed())
	g.Expect(counter(g, "druid_stretch_membership_steps_total", map[string]string{"kind": "Remove", "outcome": "Succeeded"}) - removes).To(BeNumerically("==", 3))
	n, sum := histogram(g, "druid_stretch_membership_learner_catch_up_seconds")
	g.Expect(n - catchUps).To(BeNumerically("==", 3))
	g.Eventually(podWindow(sts)).WithTimeout(10*time.Second).Should(Equal("[3, 6)"),
		"druid does not write its StatefulSet on a status change, so the controller has the webhook shrink the window")
	g.Eventually(func() bool {
		return e.runner.Running(e.ns, "etcd-main-0") || e.runner.Running(e.ns, "etcd-main-1") || e.runner.Running(e.ns, "etcd-main-2")
	}).WithTimeout(20*time.Second).Should(BeFalse(), "the old pods stop once their members are gone")
	t.Logf("moved 0-2 to 3-5 in %s; learner catch-up (add to promotion) %.1fs on average", took.Round(100*time.Millisecond), (sum-catchUpSum)/3)
}

// startExternals starts three etcd members with sidecars outside the pod
// runner: the external members of the tests that retire them.
func startExternals(ctx context.Context, g Gomega, e *env) []*localetcd.Member {
	ext, err := localetcd.New(localetcd.Options{Dir: e.t.TempDir(), CA: e.ca, Logger: e.log, Sidecar: func(m *localetcd.Member) (http.Handler, error) {
		s, err := sidecar.New(sidecar.Config{Endpoints: []string{m.LocalClientURL}, EtcdTLS: m.ClientTLSConfig(), Registry: prometheus.NewRegistry()})
		if err != nil {
			return nil, err
		}
		return closingHandler{Handler: e.calls.wrap(m.Name, s), close: s.Close}, nil
	}})
	g.Expect(err).NotTo(HaveOccurred())
	e.t.Cleanup(func() { _ = ext.Close() })
	externals, err := ext.StartCluster(ctx, names("ext", 0, 1, 2), localetcd.MemberOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return externals
}

// retiring lists externals in an Etcd with policy Retire.
func retiring(externals []*localetcd.Member) func(*v1alpha1.Etcd) {
	return func(x *v1alpha1.Etcd) {
		for _, m := range externals {
			x.Spec.ExternalMembers = append(x.Spec.ExternalMembers, v1alpha1.ExternalMember{
				Name: m.Name, PeerURLs: []string{m.PeerURL}, ClientURLs: []string{m.ClientURL}, SidecarURL: m.SidecarURL,
			})
		}
		x.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
	}
}

// TestRetireExternals replaces three external members (run outside the
// runner, listed with their sidecars, policy Retire) by three local ones.
func TestRetireExternals(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	etcd := e.newEtcd("loc", 3, retiring(startExternals(ctx, g, e)))
	ties, tieSum := histogram(g, "druid_stretch_membership_tie_duration_seconds")
	start := time.Now()
	e.startController()
	st := converged(g, etcd, current, 3*time.Minute, names("loc", 0, 1, 2)...)
	took := time.Since(start)

	calls := e.calls.snapshot()
	g.Expect(memberCounts(3, calls)).To(Equal([]int{3, 4, 3, 4, 3, 4, 3}))
	g.Expect(count(calls)).To(Equal(map[string]int{"AddLearner": 3, "Promote": 3, "MoveLeader": 1, "Remove": 3}))
	g.Expect(st.RetiredMembers).To(ConsistOf(names("ext", 0, 1, 2)))
	for _, m := range st.Members {
		g.Expect(m.Origin).To(Equal(v1alpha1.MemberOriginLocal))
	}
	// The leader stays on the externals' side until the removal that ends
	// the tie, then moves at once: the tie's promote-then-remove call and
	// the transfer right after it go to the same sidecar, the leader's,
	// where each commits without crossing to another member first.
	var tieVia, transferVia []string
	for _, c := range calls {
		switch {
		case c.Kind == "Remove" && strings.Contains(c.Path, "thenRemove="):
			tieVia = append(tieVia, c.Pod)
		case c.Kind == "MoveLeader" && c.Changed:
			transferVia = append(transferVia, c.Pod)
		}
	}
	g.Expect(tieVia).To(HaveLen(1), "one promotion made the tie and removed right after it")
	g.Expect(transferVia).To(Equal(tieVia), "the transfer follows the tie, through the same (the leader's) sidecar")
	g.Expect(names("ext", 0, 1, 2)).To(ContainElement(tieVia[0]), "the leader was still on the externals' side at the tie")
	n, sum := histogram(g, "druid_stretch_membership_tie_duration_seconds")
	g.Expect(n-ties).To(BeNumerically("==", 1), "a move of the majority between two sides passes through one tie")
	g.Expect(sum - tieSum).To(BeNumerically("<", 10))
	t.Logf("retired 3 external members in %s; one tie of %.2fs (from the promotion that made it to the removal that ended it)", took.Round(100*time.Millisecond), sum-tieSum)
}

// TestRetainedExternalMemberStaysUntilLowered retires three external
// members with spec.retainedExternalMembers 1: the controller interleaves
// as for a full retirement (never more than 4 voters, one tie), converges
// with the local members voting beside the last external member, and
// removes that one only once the field is lowered to 0.
func TestRetainedExternalMemberStaysUntilLowered(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	etcd := e.newEtcd("loc", 3, retiring(startExternals(ctx, g, e)), func(x *v1alpha1.Etcd) {
		x.Spec.RetainedExternalMembers = ptr.To[int32](1)
	})
	e.startController()
	var st *v1alpha1.MembershipStatus
	g.Eventually(func(g Gomega) {
		c := condition(g, etcd, v1alpha1.ConditionMembershipConverged)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.ObservedGeneration).To(Equal(view(g, etcd).Generation), "the generation it was created with")
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
		st = view(g, etcd).Status.Membership
		g.Expect(st.Voters()).To(HaveLen(4))
		g.Expect(st.Voters()).To(ContainElements(names("loc", 0, 1, 2)))
	}).WithTimeout(3 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	voters := st.Voters()
	kept := slices.DeleteFunc(slices.Clone(voters), func(n string) bool { return slices.Contains(names("loc", 0, 1, 2), n) })
	g.Expect(kept).To(HaveLen(1))
	g.Expect(names("ext", 0, 1, 2)).To(ContainElement(kept[0]))
	g.Expect(append(slices.Clone(st.RetiredMembers), kept[0])).To(ConsistOf(names("ext", 0, 1, 2)))
	calls := e.calls.snapshot()
	g.Expect(memberCounts(3, calls)).To(Equal([]int{3, 4, 3, 4, 3, 4}), "interleaved as a full retirement, without its last removal")
	g.Expect(count(calls)).To(Equal(map[string]int{"AddLearner": 3, "Promote": 3, "MoveLeader": 1, "Remove": 2}))
	// Converged means converged: nothing more happens while the field says 1.
	g.Consistently(func() map[string]int { return count(e.calls.snapshot()) }).WithTimeout(3*time.Second).WithPolling(250*time.Millisecond).
		Should(Equal(count(calls)), "the retained member stays while spec.retainedExternalMembers is 1")

	gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.RetainedExternalMembers = ptr.To[int32](0) })
	st = converged(g, etcd, gen, 2*time.Minute, names("loc", 0, 1, 2)...)
	g.Expect(st.RetiredMembers).To(ConsistOf(names("ext", 0, 1, 2)))
	g.Expect(count(e.calls.snapshot())).To(Equal(map[string]int{"AddLearner": 3, "Promote": 3, "MoveLeader": 1, "Remove": 3}))
}

type closingHandler struct {
	http.Handler
	close func() error
}

func (c closingHandler) Close() error { return c.close() }

// TestControllerRestartMidStep kills the controller in the middle of each
// kind of step (the call reaches etcd, the controller never hears the
// answer), starts a new one, and shows that the move of ordinal 0 to 3 ends
// with the same members and with exactly the changes it needs.
func TestControllerRestartMidStep(t *testing.T) {
	for _, kind := range []string{"AddLearner", "Promote", "MoveLeader", "Remove"} {
		t.Run(kind, func(t *testing.T) {
			// Each has its own namespace, runner and controller.
			t.Parallel()
			g := NewWithT(t)
			e := newEnv(t)
			prefix := strings.ToLower(kind)
			etcd := e.newEtcd(prefix, 3)
			first := e.startController()
			converged(g, etcd, current, 90*time.Second, names(prefix, 0, 1, 2)...)

			// Member 0 leads, so moving it away needs a MoveLeader too.
			m1, err := e.runner.Member(etcd, 1)
			g.Expect(err).NotTo(HaveOccurred())
			_, err = sidecar.NewClient(m1.SidecarURL, e.clientTLS).MoveLeader(t.Context(), names(prefix, 0)[0], sidecar.CallOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			e.calls.reset()

			e.calls.armKill(kind, first.cancel)
			gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.OrdinalStart = ptr.To[int32](1) })
			g.Eventually(e.calls.fired).WithTimeout(2 * time.Minute).Should(BeTrue())
			first.stop()
			e.startController()
			converged(g, etcd, gen, 2*time.Minute, names(prefix, 1, 2, 3)...)

			calls := e.calls.snapshot()
			g.Expect(count(calls)).To(Equal(map[string]int{"AddLearner": 1, "Promote": 1, "MoveLeader": 1, "Remove": 1}),
				"the killed %s took effect once, and the new controller repeated nothing", kind)
			g.Expect(memberCounts(3, calls)).To(Equal([]int{3, 4, 3}))
		})
	}
}

// TestDroppedStatusMidMove: status.membership, the controller's record,
// can vanish at any moment of a move of the ordinal range: the
// EtcdMembership deleted and made again by hand, say, or, where the Etcd
// carried it (the extended Etcd CRD), druid's compaction controller
// replacing the whole Etcd status. Right after each kind of step the record
// is dropped from the EtcdMembership, and druid's full status Update
// writes the Etcd's; the controller then writes its own patch over what is
// left. The pods of the old range hold voters and
// must not stop on the lost record: the move completes in its usual order,
// on the same etcd cluster (no new one bootstrapped), with the key written
// before it.
func TestDroppedStatusMidMove(t *testing.T) {
	for _, kind := range []string{"AddLearner", "Promote", "Remove"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			e := newEnv(t)
			prefix := "drop" + strings.ToLower(kind)
			etcd, sts, before := e.runningOnStatefulSet(g, prefix)
			cli := e.etcdClient(g, etcd, 0, 1, 2)
			_, err := cli.Put(t.Context(), "before-the-move", "kept")
			g.Expect(err).NotTo(HaveOccurred())
			e.calls.reset()

			dropped := make(chan error, 1)
			key := client.ObjectKeyFromObject(etcd)
			e.calls.armAfter(kind, func() { // in the sidecar's handler: no t.Fatal here
				dropped <- dropMembershipStatus(context.Background(), key)
			})
			gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.OrdinalStart = ptr.To[int32](3) })
			g.Eventually(dropped).WithTimeout(2*time.Minute).Should(Receive(BeNil()), "status.membership dropped after the first %s", kind)
			st := converged(g, etcd, gen, 3*time.Minute, names(prefix, 3, 4, 5)...)

			calls := e.calls.snapshot()
			g.Expect(memberCounts(3, calls)).To(Equal([]int{3, 4, 3, 4, 3, 4, 3}), "interleaved, never below 3 members")
			g.Expect(count(calls)).To(Equal(map[string]int{"AddLearner": 3, "Promote": 3, "MoveLeader": 1, "Remove": 3}))
			g.Expect(st.ClusterID).To(Equal(before.ClusterID), "the same etcd cluster, not a new one")
			g.Expect(reasons(events(g, etcd))).NotTo(HaveKey(v1alpha1.ReasonBootstrapping))
			cli = e.etcdClient(g, etcd, 3, 4, 5)
			got, err := cli.Get(t.Context(), "before-the-move")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got.Kvs).To(HaveLen(1))
			g.Expect(string(got.Kvs[0].Value)).To(Equal("kept"))
			g.Eventually(podWindow(sts)).WithTimeout(10*time.Second).Should(Equal("[3, 6)"), "the old pods go once their members are removed")
		})
	}
}

// dropMembershipStatus removes status.membership from the Etcd key and from
// its EtcdMembership, each with a full status Update as druid's compaction
// controller writes the Etcd's.
func dropMembershipStatus(ctx context.Context, key client.ObjectKey) error {
	got := &v1alpha1.Etcd{}
	if err := k8s.Get(ctx, key, got); err != nil {
		return err
	}
	got.Status.Membership = nil
	if err := k8s.Status().Update(ctx, got); err != nil {
		return err
	}
	m, err := etcdview.GetMembership(ctx, k8s, key)
	if err != nil || m == nil {
		return cmp.Or(err, fmt.Errorf("no EtcdMembership %s", key))
	}
	m.Status.Membership = nil
	return k8s.Status().Update(ctx, m)
}

// pruneInlineFields removes druid-stretch's fields and status.membership
// from the Etcd key, stored under the extended Etcd CRD, as the API server
// prunes them at the next write of an Etcd once druid's own CRD is back
// (gardenlet re-applies it every minute).
func pruneInlineFields(ctx context.Context, key client.ObjectKey) error {
	got := &v1alpha1.Etcd{}
	if err := k8s.Get(ctx, key, got); err != nil {
		return err
	}
	got.Spec.MembershipSpec = v1alpha1.MembershipSpec{}
	if err := k8s.Update(ctx, got); err != nil {
		return err
	}
	got.Status.Membership = nil
	return k8s.Status().Update(ctx, got)
}

// updateInline changes the Etcd's inline fields as a user did under the
// extended Etcd CRD: one write of the Etcd, and the controller copies them
// into the EtcdMembership.
func updateInline(g Gomega, etcd *v1alpha1.Etcd, mutate func(*v1alpha1.Etcd)) {
	ctx := context.Background()
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got := &v1alpha1.Etcd{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(etcd), got); err != nil {
			return err
		}
		mutate(got)
		return k8s.Update(ctx, got)
	})).To(Succeed())
}

// TestFieldsPrunedFromTheEtcdMidMove: an Etcd stored under the extended
// Etcd CRD, its fields inline, is moved by an edit of them; right after
// the first AddLearner of the move of the ordinal range, the Etcd loses
// druid-stretch's fields and status.membership, as druid's own CRD prunes
// them. The controller had copied both into the Etcd's EtcdMembership: the
// move completes from it, in the usual order, on the same cluster, and the
// Etcd is never written with the fields again.
func TestFieldsPrunedFromTheEtcdMidMove(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	e := newExtendedEnv(t)
	etcd, sts, before := e.runningOnStatefulSet(g, "pruned")
	m, err := etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(etcd))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m).NotTo(BeNil(), "the controller copied the Etcd's fields into an EtcdMembership")
	g.Expect(m.Spec.OrdinalStart).To(Equal(ptr.To[int32](0)))
	g.Expect(m.OwnerReferences).To(ConsistOf(HaveField("UID", etcd.UID)), "owned by its Etcd, so that it goes with it")
	e.calls.reset()

	pruned := make(chan error, 1)
	e.calls.armAfter("AddLearner", func() { // in the sidecar's handler: no t.Fatal here
		pruned <- pruneInlineFields(context.Background(), client.ObjectKeyFromObject(etcd))
	})
	updateInline(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.OrdinalStart = ptr.To[int32](3) })
	g.Eventually(pruned).WithTimeout(2*time.Minute).Should(Receive(BeNil()), "the fields pruned after the first AddLearner")
	stored := &v1alpha1.Etcd{}
	g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(etcd), stored)).To(Succeed())
	g.Expect(stored.Spec.MembershipSpec).To(BeZero())
	st := converged(g, etcd, current, 3*time.Minute, names("pruned", 3, 4, 5)...)

	calls := e.calls.snapshot()
	g.Expect(memberCounts(3, calls)).To(Equal([]int{3, 4, 3, 4, 3, 4, 3}), "interleaved, never below 3 members")
	g.Expect(count(calls)).To(Equal(map[string]int{"AddLearner": 3, "Promote": 3, "MoveLeader": 1, "Remove": 3}))
	g.Expect(st.ClusterID).To(Equal(before.ClusterID), "the same etcd cluster, not a new one")
	g.Expect(reasons(events(g, etcd))).NotTo(HaveKey("ExtensionLost"))
	g.Eventually(podWindow(sts)).WithTimeout(10*time.Second).Should(Equal("[3, 6)"), "the old pods go once their members are removed")
	g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(etcd), stored)).To(Succeed())
	g.Expect(stored.Spec.MembershipSpec).To(BeZero(), "the Etcd stays druid's")
	g.Expect(stored.Status.Membership).To(BeNil(), "the status lives in the EtcdMembership")
	m, err = etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(etcd))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.Spec.OrdinalStart).To(Equal(ptr.To[int32](3)))
	g.Expect(m.Status.Membership.Voters()).To(ConsistOf(names("pruned", 3, 4, 5)))
}

// TestLostExtensionFieldsAreReported: druid-stretch's fields vanish with
// the EtcdMembership (deleted), the one place druid's own CRD leaves them.
// The controller then sees a plain Etcd whose StatefulSet runs its sidecar:
// it changes nothing and says so (a Warning event and a metric), and
// resumes once the fields are back.
func TestLostExtensionFieldsAreReported(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	etcd, _, before := e.runningOnStatefulSet(g, "lost")
	e.calls.reset()

	m, err := etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(etcd))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m).NotTo(BeNil())
	g.Expect(k8s.Delete(t.Context(), m)).To(Succeed())
	lost := map[string]string{"namespace": etcd.Namespace, "etcd": etcd.Name}
	g.Eventually(func(g Gomega) {
		g.Expect(reasons(events(g, etcd))).To(HaveKey("ExtensionLost"))
		g.Expect(counter(g, "druid_stretch_membership_extension_lost", lost)).To(BeNumerically("==", 1))
	}).WithTimeout(30 * time.Second).Should(Succeed())
	g.Expect(changes(e.calls.snapshot())).To(BeEmpty(), "nothing is changed while the fields are gone")
	for _, pod := range []string{"etcd-main-0", "etcd-main-1", "etcd-main-2"} {
		g.Expect(e.runner.Running(e.ns, pod)).To(BeTrue(), "%s runs on", pod)
	}

	gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.OrdinalStart = ptr.To[int32](0) })
	st := converged(g, etcd, gen, 90*time.Second, names("lost", 0, 1, 2)...)
	g.Expect(st.ClusterID).To(Equal(before.ClusterID))
	g.Expect(counter(g, "druid_stretch_membership_extension_lost", lost)).To(BeNumerically("==", 0), "the series goes once the fields are back")
	g.Expect(changes(e.calls.snapshot())).To(BeEmpty())
}

// TestSidecar5xxDegradesAndChangesNothing: while every sidecar answers the
// membership calls with 500, the controller reports MembershipDegraded
// naming the member and the cause, retries with backoff, and changes
// nothing; once the sidecars recover it converges.
func TestSidecar5xxDegradesAndChangesNothing(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	etcd := e.newEtcd("five", 3)
	e.startController()
	converged(g, etcd, current, 90*time.Second, names("five", 0, 1, 2)...)
	e.calls.reset()
	e.calls.setFault(func(r *http.Request) (int, string, bool) {
		if stepKind(r) == "" {
			return 0, "", false
		}
		return http.StatusInternalServerError, `{"reason":"InternalError","message":"injected fault"}`, true
	})
	gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.Replicas = 4 })
	newcomer := names("five", 3)[0]
	g.Eventually(func(g Gomega) {
		c := condition(g, etcd, v1alpha1.ConditionMembershipDegraded)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(v1alpha1.ReasonStepFailed))
		g.Expect(c.Message).To(And(ContainSubstring(newcomer), ContainSubstring("500"), ContainSubstring("injected fault")))
	}).WithTimeout(30 * time.Second).Should(Succeed())
	t.Logf("MembershipDegraded: %s", condition(g, etcd, v1alpha1.ConditionMembershipDegraded).Message)

	cli := e.etcdClient(g, etcd, 0, 1, 2)
	g.Consistently(func(g Gomega) {
		resp, err := cli.MemberList(context.Background())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.Members).To(HaveLen(3))
	}).WithTimeout(4 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	calls := e.calls.snapshot()
	g.Expect(changes(calls)).To(BeEmpty())
	attempts := 0
	for _, c := range calls {
		if c.Kind == "AddLearner" && c.Code == http.StatusInternalServerError {
			attempts++
		}
	}
	g.Expect(attempts).To(BeNumerically(">=", 2), "retried")
	g.Expect(attempts).To(BeNumerically("<=", 6), "with backoff, not in a tight loop")
	last := view(g, etcd).Status.Membership.LastStep
	g.Expect(last).NotTo(BeNil())
	g.Expect(last.Reason).To(Equal("OutcomeUncertain"))

	e.calls.setFault(nil)
	converged(g, etcd, gen, 2*time.Minute, names("five", 0, 1, 2, 3)...)
	g.Expect(condition(g, etcd, v1alpha1.ConditionMembershipDegraded).Status).To(Equal(metav1.ConditionFalse))
	g.Expect(count(e.calls.snapshot())).To(Equal(map[string]int{"AddLearner": 1, "Promote": 1}))
}

// TestUnmanagedMemberIsReportedAndLeftAlone: a member that is neither local
// nor external is reported and never touched, also while the controller
// moves the local members around it.
func TestUnmanagedMemberIsReportedAndLeftAlone(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	etcd := e.newEtcd("um", 3)
	e.startController()
	converged(g, etcd, current, 90*time.Second, names("um", 0, 1, 2)...)

	var via []*localetcd.Member
	for o := range int64(3) {
		m, err := e.runner.Member(etcd, o)
		g.Expect(err).NotTo(HaveOccurred())
		via = append(via, m)
	}
	var stranger *localetcd.Member
	g.Eventually(func() (err error) {
		// etcd refuses while the members have been connected for less than 5 s.
		stranger, err = e.runner.Runtime().JoinAsLearner(t.Context(), "stranger", localetcd.MemberOptions{}, via...)
		return err
	}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
	cli := e.etcdClient(g, etcd, 0, 1, 2)
	var strangerID uint64
	g.Eventually(func() error {
		resp, err := cli.MemberList(context.Background())
		if err != nil {
			return err
		}
		for _, m := range resp.Members {
			if m.Name == stranger.Name {
				strangerID = m.ID
			}
		}
		_, err = cli.MemberPromote(context.Background(), strangerID)
		return err
	}).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	e.calls.reset()

	g.Eventually(func(g Gomega) {
		c := condition(g, etcd, v1alpha1.ConditionMembershipDegraded)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(v1alpha1.ReasonUnmanagedMembers))
		g.Expect(c.Message).To(ContainSubstring("stranger"))
	}).WithTimeout(45 * time.Second).Should(Succeed())
	t.Logf("MembershipDegraded: %s", condition(g, etcd, v1alpha1.ConditionMembershipDegraded).Message)

	gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.OrdinalStart = ptr.To[int32](1) })
	st := converged(g, etcd, gen, 2*time.Minute, append(names("um", 1, 2, 3), "stranger")...)
	for _, m := range st.Members {
		if m.Name == "stranger" {
			g.Expect(m.Origin).To(Equal(v1alpha1.MemberOriginUnmanaged))
		}
	}
	calls := e.calls.snapshot()
	made := count(calls)
	g.Expect(made).To(HaveKeyWithValue("AddLearner", 1))
	g.Expect(made).To(HaveKeyWithValue("Promote", 1))
	g.Expect(made).To(HaveKeyWithValue("Remove", 1))
	g.Expect(made["MoveLeader"]).To(BeNumerically("<=", 1))
	for _, c := range calls {
		g.Expect(c.Path).NotTo(Or(ContainSubstring("stranger"), ContainSubstring(fmt.Sprintf("%x", strangerID))), "the unmanaged member is never a target")
	}
	g.Expect(changes(calls)).NotTo(BeEmpty())
	g.Expect(condition(g, etcd, v1alpha1.ConditionMembershipDegraded).Reason).To(Equal(v1alpha1.ReasonUnmanagedMembers))
}

// TestStuckLearnerIsRemovedAndReported: a learner whose pod never starts
// is removed again after the progress timeout, reported as LearnerStalled
// (condition and event), and added again once its pod can run.
func TestStuckLearnerIsRemovedAndReported(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	etcd := e.newEtcd("stuck", 3)
	e.startController(func(o *membershipctrl.ManagerOptions) { o.Reconciler.LearnerProgressTimeout = 3 * time.Second })
	converged(g, etcd, current, 90*time.Second, names("stuck", 0, 1, 2)...)
	e.runner.Hold(e.ns, "etcd-main-3")
	e.calls.reset()
	gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.Replicas = 4 })
	learner := names("stuck", 3)[0]

	g.Eventually(func(g Gomega) {
		c := condition(g, etcd, v1alpha1.ConditionMembershipDegraded)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(v1alpha1.ReasonLearnerStalled))
		g.Expect(c.Message).To(ContainSubstring(learner))
	}).WithTimeout(45 * time.Second).Should(Succeed())
	t.Logf("MembershipDegraded: %s", condition(g, etcd, v1alpha1.ConditionMembershipDegraded).Message)
	last := view(g, etcd).Status.Membership.LastStep
	g.Expect(last.Kind).To(Equal(v1alpha1.StepRemoveMember))
	g.Expect(last.Member).To(Equal(learner))
	g.Expect(last.Reason).To(Equal(v1alpha1.ReasonLearnerStalled))
	g.Eventually(func(g Gomega) {
		var warned bool
		for _, ev := range events(g, etcd) {
			if ev.Reason == v1alpha1.ReasonLearnerStalled && ev.Type == "Warning" && strings.Contains(ev.Message, learner) {
				warned = true
			}
		}
		g.Expect(warned).To(BeTrue())
	}).WithTimeout(10 * time.Second).Should(Succeed())
	g.Expect(memberCounts(3, e.calls.snapshot())[:3]).To(Equal([]int{3, 4, 3}))

	e.runner.Release(e.ns, "etcd-main-3")
	converged(g, etcd, gen, 2*time.Minute, names("stuck", 0, 1, 2, 3)...)
}

// etcdClient talks to the given pods' members directly, not through a
// sidecar, to check what etcd itself says.
func (e *env) etcdClient(g Gomega, etcd *v1alpha1.Etcd, ordinals ...int64) *clientv3.Client {
	var eps []string
	var m *localetcd.Member
	for _, o := range ordinals {
		var err error
		m, err = e.runner.Member(etcd, o)
		g.Expect(err).NotTo(HaveOccurred())
		eps = append(eps, m.ClientURL)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: m.ClientTLSConfig(), DialTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	e.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// druidStatefulSet stands in for the StatefulSet druid creates for etcd:
// owned by it, of the same name. No admission webhook runs here, so only
// its pod-window annotation moves.
func druidStatefulSet(g Gomega, etcd *v1alpha1.Etcd) *appsv1.StatefulSet {
	labels := map[string]string{"app": "etcd", "instance": etcd.Name}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: etcd.Name, Namespace: etcd.Namespace},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To(etcd.Spec.Replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "etcd"}}},
			},
		},
	}
	scheme, err := membershipctrl.Scheme()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(controllerutil.SetControllerReference(etcd, sts, scheme)).To(Succeed())
	g.Expect(k8s.Create(context.Background(), sts)).To(Succeed())
	return sts
}

// podWindow polls the pod-window annotation of sts.
func podWindow(sts *appsv1.StatefulSet) func(Gomega) string {
	return func(g Gomega) string {
		got := &appsv1.StatefulSet{}
		g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(sts), got)).To(Succeed())
		return got.Annotations[webhook.PodWindowAnnotation]
	}
}

// TestHibernation scales an Etcd to zero and back, as Gardener hibernates a
// shoot: the pods stop, etcd's membership is left alone, and the same
// members (same IDs, with their data) come back.
func TestHibernation(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	etcd := e.newEtcd("hib", 3)
	e.startController()
	before := converged(g, etcd, current, 90*time.Second, names("hib", 0, 1, 2)...)
	ids := map[string]string{}
	for _, m := range before.Members {
		ids[m.Name] = m.ID
	}
	e.calls.reset()

	gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.Replicas = 0 })
	g.Eventually(func(g Gomega) {
		c := condition(g, etcd, v1alpha1.ConditionMembershipConverged)
		g.Expect(c.ObservedGeneration).To(Equal(gen))
		g.Expect(c.Reason).To(Equal(v1alpha1.ReasonScaledToZero))
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
	}).WithTimeout(30 * time.Second).Should(Succeed())
	g.Eventually(func() []string {
		var running []string
		for o := range 3 {
			if pod := fmt.Sprintf("etcd-main-%d", o); e.runner.Running(e.ns, pod) {
				running = append(running, pod)
			}
		}
		return running
	}).WithTimeout(30*time.Second).Should(BeEmpty(), "every pod stops: the pod window is empty")
	g.Expect(changes(e.calls.snapshot())).To(BeEmpty(), "no member is removed for a hibernation")

	gen = update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.Replicas = 3 })
	after := converged(g, etcd, gen, 2*time.Minute, names("hib", 0, 1, 2)...)
	for _, m := range after.Members {
		g.Expect(m.ID).To(Equal(ids[m.Name]), "%s came back as the same member", m.Name)
	}
	g.Expect(changes(e.calls.snapshot())).To(BeEmpty(), "waking up needs no membership change")
}

// TestRefusedPodWindowPatchIsReported: an admission policy refuses
// every update of the StatefulSet (as druid's component protection does
// without the exemption docs/install.md asks for). The controller still
// converges and writes status; the refusal is a Warning event, and the
// StatefulSet is left as it was.
func TestRefusedPodWindowPatchIsReported(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	ctx := context.Background()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "protect-statefulsets-"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"statefulsets"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "only druid may write druid's StatefulSets"}},
		},
	}
	g.Expect(k8s.Create(ctx, policy)).To(Succeed())
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "protect-statefulsets-"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": e.ns},
			}},
		},
	}
	g.Expect(k8s.Create(ctx, binding)).To(Succeed())
	t.Cleanup(func() {
		_ = k8s.Delete(context.Background(), binding)
		_ = k8s.Delete(context.Background(), policy)
	})

	etcd := e.newEtcd("ref", 3)
	sts := druidStatefulSet(g, etcd)
	// The policy takes effect once the API server has loaded it: until a
	// probe update is refused, the test would prove nothing.
	g.Eventually(func() error {
		probe := &appsv1.StatefulSet{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(sts), probe); err != nil {
			return err
		}
		probe.Labels = map[string]string{"probe": "1"}
		return k8s.Update(ctx, probe)
	}).WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring("only druid may write druid's StatefulSets")))

	e.startController()
	converged(g, etcd, current, 90*time.Second, names("ref", 0, 1, 2)...)
	g.Eventually(func(g Gomega) {
		g.Expect(reasons(events(g, etcd))).To(HaveKey("PodWindowNotSynced"))
	}).WithTimeout(10 * time.Second).Should(Succeed())
	g.Expect(podWindow(sts)(g)).To(BeEmpty(), "the refused patch changed nothing")
}

// TestEtcdMembershipWithoutEtcd: an EtcdMembership attaches to the Etcd of
// its own name. One whose Etcd does not exist says so in its Attached
// condition and nothing is planned; once the Etcd is created, the pair is
// planned and the condition turns True.
func TestEtcdMembershipWithoutEtcd(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	m := stretchv1alpha1.For(&v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: e.ns}}, v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](0)})
	g.Expect(k8s.Create(t.Context(), m)).To(Succeed())
	e.startController()
	attached := func(g Gomega) *metav1.Condition {
		got, err := etcdview.GetMembership(context.Background(), k8s, client.ObjectKeyFromObject(m))
		g.Expect(err).NotTo(HaveOccurred())
		return meta.FindStatusCondition(got.Status.Conditions, stretchv1alpha1.ConditionAttached)
	}
	g.Eventually(func(g Gomega) {
		c := attached(g)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(stretchv1alpha1.ReasonEtcdNotFound))
		g.Expect(c.Message).To(ContainSubstring("no Etcd etcd-main"))
	}).WithTimeout(30 * time.Second).Should(Succeed())
	g.Expect(e.calls.snapshot()).To(BeEmpty(), "no sidecar is asked for an EtcdMembership without its Etcd")

	etcd := e.newEtcd("late", 3, func(x *v1alpha1.Etcd) { x.Spec.OrdinalStart = nil })
	converged(g, etcd, current, 90*time.Second, names("late", 0, 1, 2)...)
	g.Eventually(func(g Gomega) {
		c := attached(g)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
	}).WithTimeout(10 * time.Second).Should(Succeed())
}

// runningOnStatefulSet starts the controller on a new 3-member Etcd of the
// prefix whose druid StatefulSet exists, and waits until the members
// converged and the StatefulSet runs ordinals 0-2. It returns the Etcd, the
// StatefulSet and the converged status.
func (e *env) runningOnStatefulSet(g Gomega, prefix string) (*v1alpha1.Etcd, *appsv1.StatefulSet, *v1alpha1.MembershipStatus) {
	etcd := e.newEtcd(prefix, 3)
	sts := druidStatefulSet(g, etcd)
	e.startController()
	st := converged(g, etcd, current, 90*time.Second, names(prefix, 0, 1, 2)...)
	g.Eventually(podWindow(sts)).WithTimeout(10 * time.Second).Should(Equal("[0, 3)"))
	return etcd, sts, st
}
