package membership_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/podrunner"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// learnerPeaks replays the changes from three voters: the most learners
// and the most voters the cluster held at once.
func learnerPeaks(calls []call) (learners, voters int) {
	l, v := 0, 3
	voters = v
	for _, c := range changes(calls) {
		switch c.Kind {
		case "AddLearner":
			l++
		case "Promote":
			l, v = l-1, v+1
		case "Remove":
			v--
		}
		learners, voters = max(learners, l), max(voters, v)
	}
	return learners, voters
}

// kinds are the kinds of the changes, in order.
func kinds(calls []call) []string {
	var out []string
	for _, c := range changes(calls) {
		out = append(out, c.Kind)
	}
	return out
}

// TestParallelLearners moves ordinals 0-2 to 3-5 with etcd and the
// controller both at --max-learners 3: the three new members are added
// before the first promotion, the learners never exceed the limit, and the
// promotions still interleave with the removals (never more than four
// voters, one leader transfer).
func TestParallelLearners(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, func(o *podrunner.Options) { o.EtcdArgs = []string{"--max-learners=3"} })
	etcd := e.newEtcd("pl", 3)
	druidStatefulSet(g, etcd)
	e.startController(func(o *membershipctrl.ManagerOptions) { o.Reconciler.MaxLearners = 3 })
	converged(g, etcd, current, 90*time.Second, names("pl", 0, 1, 2)...)

	start := time.Now()
	gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.OrdinalStart = ptr.To[int32](3) })
	converged(g, etcd, gen, 3*time.Minute, names("pl", 3, 4, 5)...)
	calls := e.calls.snapshot()
	g.Expect(kinds(calls)).To(HaveLen(10))
	g.Expect(kinds(calls)[:3]).To(Equal([]string{"AddLearner", "AddLearner", "AddLearner"}), "all three learners before the first promotion: %v", kinds(calls))
	learners, voters := learnerPeaks(calls)
	g.Expect(learners).To(Equal(3))
	g.Expect(voters).To(Equal(4), "interleaved: n, n+1, n")
	g.Expect(count(calls)).To(Equal(map[string]int{"AddLearner": 3, "Promote": 3, "MoveLeader": 1, "Remove": 3}))
	for _, c := range calls {
		g.Expect(c.Code).NotTo(Equal(http.StatusConflict), "etcd refused no learner: %+v", c)
	}
	t.Logf("moved 0-2 to 3-5 with three learners at once in %s", time.Since(start).Round(100*time.Millisecond))
}

// TestEtcdsLearnerLimitIsNotAFailedStep: a controller told it may run three
// learners, on etcd members that accept one (etcd's default), meets etcd's
// refusal of the second learner. It plans with etcd's limit from then on,
// says so in an event, and never reports the refusal as a failed step; the move completes
// as with one learner at a time.
func TestEtcdsLearnerLimitIsNotAFailedStep(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	etcd := e.newEtcd("ll", 3)
	druidStatefulSet(g, etcd)
	e.startController(func(o *membershipctrl.ManagerOptions) { o.Reconciler.MaxLearners = 3 })
	converged(g, etcd, current, 90*time.Second, names("ll", 0, 1, 2)...)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	failed := make(chan *v1alpha1.MembershipStep, 1)
	go func() {
		// The statuses the controller writes during the move are sampled:
		// the refusal, reported as a failed step, would show as lastStep
		// with outcome Failed and etcd's reason.
		for ctx.Err() == nil {
			if p, err := etcdview.Get(ctx, k8s, client.ObjectKeyFromObject(etcd)); err == nil && p.View.Status.Membership != nil {
				if l := p.View.Status.Membership.LastStep; l != nil && l.Outcome == v1alpha1.StepFailed && l.Reason == sidecar.ReasonTooManyLearners {
					failed <- l
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.OrdinalStart = ptr.To[int32](3) })
	converged(g, etcd, gen, 3*time.Minute, names("ll", 3, 4, 5)...)
	cancel()
	select {
	case l := <-failed:
		t.Fatalf("a failed step was reported: %+v", *l)
	default:
	}

	calls := e.calls.snapshot()
	refused := 0
	for _, c := range calls {
		if c.Kind == "AddLearner" && c.Code == http.StatusConflict {
			refused++
		}
	}
	g.Expect(refused).To(Equal(1), "etcd refused one learner, then the controller kept to its limit")
	learners, voters := learnerPeaks(calls)
	g.Expect(learners).To(Equal(1))
	g.Expect(voters).To(Equal(4))
	g.Expect(memberCounts(3, calls)).To(Equal([]int{3, 4, 3, 4, 3, 4, 3}))
	g.Eventually(func(g Gomega) {
		r := reasons(events(g, etcd))
		g.Expect(r).To(HaveKeyWithValue("LearnerLimit", 1))
		g.Expect(r).NotTo(HaveKey(v1alpha1.ReasonStepFailed))
	}).WithTimeout(10 * time.Second).Should(Succeed())
}

// TestLearnerReplicasStayLearners scales a 1-member Etcd to 3 with
// spec.learnerReplicas 2 (etcd and the controller at --max-learners 3):
// the two new members join as learners and stay learners, the controller
// converges on that and says so in the member roles, and etcd's member list
// agrees. Lowered to 0, they are promoted, and nothing else changes;
// raised again, the voters stay voters.
func TestLearnerReplicasStayLearners(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, func(o *podrunner.Options) { o.EtcdArgs = []string{"--max-learners=3"} })
	etcd := e.newEtcd("lr", 1)
	druidStatefulSet(g, etcd)
	e.startController(func(o *membershipctrl.ManagerOptions) { o.Reconciler.MaxLearners = 3 })
	converged(g, etcd, current, 90*time.Second, names("lr", 0)...)

	gen := update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.Replicas, x.Spec.LearnerReplicas = 3, ptr.To[int32](2) })
	st := converged(g, etcd, gen, 2*time.Minute, names("lr", 0)...)
	roles := map[string]v1alpha1.MemberRole{}
	for _, m := range st.Members {
		roles[m.Name] = m.Role
	}
	learners := names("lr", 1, 2)
	g.Expect(roles).To(Equal(map[string]v1alpha1.MemberRole{names("lr", 0)[0]: v1alpha1.MemberRoleLeader,
		learners[0]: v1alpha1.MemberRoleLearner, learners[1]: v1alpha1.MemberRoleLearner}))
	cli := e.etcdClient(g, etcd, 0)
	list, err := cli.MemberList(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	var inEtcd []string
	for _, m := range list.Members {
		if m.IsLearner {
			inEtcd = append(inEtcd, m.Name)
		}
	}
	g.Expect(inEtcd).To(ConsistOf(learners), "etcd's own member list")
	g.Expect(count(e.calls.snapshot())).To(Equal(map[string]int{"AddLearner": 2}), "added, never promoted")

	gen = update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.LearnerReplicas = nil })
	converged(g, etcd, gen, time.Minute, names("lr", 0, 1, 2)...)
	g.Expect(count(e.calls.snapshot())).To(Equal(map[string]int{"AddLearner": 2, "Promote": 2}))

	// Raised again, it changes nothing: etcd cannot make a voter a learner.
	gen = update(g, etcd, func(x *v1alpha1.Etcd) { x.Spec.LearnerReplicas = ptr.To[int32](2) })
	converged(g, etcd, gen, time.Minute, names("lr", 0, 1, 2)...)
	g.Expect(count(e.calls.snapshot())).To(Equal(map[string]int{"AddLearner": 2, "Promote": 2}))
}
