package sidecar_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// swapSetup is a three-member cluster whose first member's sidecar (via,
// c) holds the lock, with a learner (nm) added and started, its leader,
// and target, a voter that is neither the leader nor via.
type swapSetup struct {
	tc             *testCluster
	ctx            context.Context
	c              *sidecar.Client
	via            *localetcd.Member
	nm             *localetcd.Member
	leader, target string
	fresh          func() sidecar.CallOptions
}

func startSwap(t *testing.T, g Gomega, holder string) *swapSetup {
	t.Helper()
	tc := startCluster(t, 3, clusterOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	s := &swapSetup{tc: tc, ctx: ctx, via: tc.Members[0], c: tc.client(tc.Members[0])}
	_, err := s.c.AcquireLock(ctx, holder, "", time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	s.fresh = func() sidecar.CallOptions {
		l, err := s.c.Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		return sidecar.CallOptions{LockHolder: holder, Fingerprint: l.Fingerprint}
	}
	s.nm, err = tc.Runtime.NewMember("etcd-new", localetcd.MemberOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	opts := s.fresh()
	retryWhile(g, sidecar.ReasonUnhealthyCluster, 30*time.Second, func() error {
		_, err := s.c.AddLearner(ctx, s.nm.Name, []string{s.nm.PeerURL}, opts)
		return err
	})
	g.Expect(s.nm.Start(ctx, localetcd.InitialCluster(append(tc.Members, s.nm)...), localetcd.ClusterStateExisting)).To(Succeed())
	list, err := s.c.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	s.leader = leaderName(list)
	for _, m := range tc.Members[1:] {
		if m.Name != s.leader {
			s.target = m.Name
			break
		}
	}
	g.Expect(s.target).NotTo(BeEmpty())
	return s
}

// TestPromoteThenRemove promotes a learner and removes an old voter in one
// call, the step through the tie of a move, after showing that the refusals
// (the leader as target, the learner itself, a stranger) change nothing.
func TestPromoteThenRemove(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	sw := startSwap(t, g, "swap-test")
	tc, ctx, c, via, nm, leader, target, fresh := sw.tc, sw.ctx, sw.c, sw.via, sw.nm, sw.leader, sw.target, sw.fresh
	before := tc.membership(g, via)
	for _, bad := range []struct{ then, reason string }{
		{leader, sidecar.ReasonIsLeader},
		{nm.Name, sidecar.ReasonInvalidArgument},
		{"stranger", sidecar.ReasonMemberNotFound},
	} {
		// The learner may not be ready yet: that refusal comes first and
		// changes nothing either; wait for the one under test.
		g.Eventually(func() string {
			_, err := c.PromoteThenRemove(ctx, nm.Name, bad.then, fresh())
			var reason string
			if se := asSidecarError(err); se != nil {
				reason = se.Reason
			}
			return reason
		}).WithTimeout(30*time.Second).WithPolling(250*time.Millisecond).Should(Equal(bad.reason), "thenRemove=%s", bad.then)
		g.Expect(tc.membership(g, via)).To(Equal(before), "a refused call changes nothing (thenRemove=%s)", bad.then)
	}

	var res *sidecar.ChangeResult
	start := time.Now()
	g.Eventually(func() error {
		var err error
		res, err = c.PromoteThenRemove(ctx, nm.Name, target, fresh())
		return err
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
	t.Logf("promoted %s and removed %s in %s; %.3f s between the two answers", nm.Name, target, time.Since(start), res.GapSeconds)
	g.Expect(res.Changed).To(BeTrue())
	g.Expect(res.Member.IsLearner).To(BeFalse())
	g.Expect(res.RemoveError).To(BeEmpty())
	g.Expect(res.Removed).NotTo(BeNil())
	g.Expect(res.Removed.Name).To(Equal(target))
	g.Expect(res.GapSeconds).To(BeNumerically(">", 0))
	after := tc.membership(g, via)
	g.Expect(after).To(HaveLen(3))
	g.Expect(after).To(ContainElement(ContainSubstring("name=etcd-new learner=false")))
	g.Expect(after).NotTo(ContainElement(ContainSubstring("name=" + target + " ")))

	// A repeat finds the promotion in place and changes nothing.
	again, err := c.PromoteThenRemove(ctx, nm.Name, target, fresh())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.Changed).To(BeFalse())
	g.Expect(again.Removed).To(BeNil())
	g.Expect(tc.membership(g, via)).To(Equal(after))
}

func asSidecarError(err error) *sidecar.Error {
	se, _ := err.(*sidecar.Error)
	return se
}

// TestPromoteOnceCaughtUp: a learner that answers and is caught up is
// promoted on the first call, whatever time it has been connected: etcd
// puts no time on a promotion (its leader checks only the learner's log).
// Asked while the learner has just started, before etcd's strict
// reconfiguration check would count it (5 s).
func TestPromoteOnceCaughtUp(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	sw := startSwap(t, g, "caught-up-test")
	tc, ctx, c, via, nm, fresh := sw.tc, sw.ctx, sw.c, sw.via, sw.nm, sw.fresh

	var learner *sidecar.Member
	g.Eventually(func(g Gomega) {
		l, err := c.Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		learner = memberByName(l, nm.Name)
		g.Expect(learner).NotTo(BeNil())
		g.Expect(learner.IsLearner).To(BeTrue())
		g.Expect(learner.Healthy).To(BeTrue(), learner.Error)
		g.Expect(learner.BehindLeader).To(BeNumerically("<=", 1000))
	}).WithTimeout(30 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	t.Logf("caught up: %d entries behind, healthy for %.3f s, connected for %.3f s", learner.BehindLeader, learner.HealthyForSeconds, learner.ConnectedForSeconds)
	before := tc.membership(g, via)

	res, err := c.Promote(ctx, nm.Name, fresh())
	g.Expect(err).NotTo(HaveOccurred(), "the first promotion once the learner caught up")
	g.Expect(res.Changed).To(BeTrue())
	g.Expect(res.Member.IsLearner).To(BeFalse())
	after := tc.membership(g, via)
	g.Expect(after).To(HaveLen(len(before)))
	g.Expect(after).To(ContainElement(ContainSubstring("name=etcd-new learner=false")))
}
