package sidecar_test

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestMembershipSequence adds a learner, starts it, promotes it, removes an
// old member and moves leadership to the new one, all through one sidecar,
// repeating every call to show it is idempotent.
func TestMembershipSequence(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, 3, clusterOptions{})
	runSequence(t, tc, "")
}

// TestMembershipSequenceWAN is the same sequence with every member in its
// own site and 180 ms RTT between every two sites, with etcd's heartbeat
// at about one round trip and its election timeout ten heartbeats, as
// etcd's tuning guide advises for that distance.
func TestMembershipSequenceWAN(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, 3, clusterOptions{
		sites:     []string{"site-0", "site-1", "site-2", "site-new"},
		oneWay:    90 * time.Millisecond,
		heartbeat: 200 * time.Millisecond,
		election:  2000 * time.Millisecond,
	})
	runSequence(t, tc, "site-new")
}

func runSequence(t *testing.T, tc *testCluster, newSite string) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	via := tc.Members[0]
	c := tc.client(via)

	const holder = "sequence-test"
	lock, err := c.AcquireLock(ctx, holder, "", time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lock.Holder).To(Equal(holder))
	list, err := c.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(list.Members).To(HaveLen(3))
	g.Expect(list.Lock).NotTo(BeNil())
	g.Expect(list.Lock.Holder).To(Equal(holder))
	for _, m := range list.Members {
		g.Expect(m.Healthy).To(BeTrue(), "member %s: %s", m.Name, m.Error)
	}
	opts := sidecar.CallOptions{LockHolder: holder, Fingerprint: list.Fingerprint}

	// Add a learner; a repeat finds it there and changes nothing.
	nm, err := tc.Runtime.NewMember("etcd-new", localetcd.MemberOptions{Site: newSite})
	g.Expect(err).NotTo(HaveOccurred())
	// etcd refuses reconfigurations until its members have been connected
	// for 5 s (a fresh cluster): UnhealthyCluster, retried.
	var added *sidecar.ChangeResult
	start := time.Now()
	refused := retryWhile(g, sidecar.ReasonUnhealthyCluster, 30*time.Second, func() (err error) {
		added, err = c.AddLearner(ctx, nm.Name, []string{nm.PeerURL}, opts)
		return err
	})
	t.Logf("added the learner in %s after %d UnhealthyCluster refusals", time.Since(start), refused)
	g.Expect(added.Changed).To(BeTrue())
	g.Expect(added.Member.IsLearner).To(BeTrue())
	g.Expect(added.Member.PeerURLs).To(Equal([]string{nm.PeerURL}))
	withLearner := tc.membership(g, via)
	g.Expect(withLearner).To(HaveLen(4))
	g.Expect(withLearner).To(ContainElement(ContainSubstring(added.Member.ID + " name= learner=true")))
	again, err := c.AddLearner(ctx, nm.Name, []string{nm.PeerURL}, opts)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.Changed).To(BeFalse())
	g.Expect(again.Member.ID).To(Equal(added.Member.ID))
	g.Expect(tc.membership(g, via)).To(Equal(withLearner))

	// Not started: not ready, with a hint.
	list, err = c.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	opts.Fingerprint = list.Fingerprint
	_, err = c.Promote(ctx, added.Member.ID, opts)
	g.Expect(sidecar.IsReason(err, sidecar.ReasonLearnerNotReady)).To(BeTrue(), "promote before start: %v", err)
	var se *sidecar.Error
	g.Expect(errors.As(err, &se)).To(BeTrue())
	g.Expect(se.StatusCode).To(Equal(409))
	g.Expect(se.RetryAfter).To(BeNumerically(">", 0))
	g.Expect(tc.membership(g, via)).To(Equal(withLearner))

	started := time.Now()
	g.Expect(nm.Start(ctx, localetcd.InitialCluster(append(tc.Members, nm)...), localetcd.ClusterStateExisting)).To(Succeed())
	t.Logf("learner started in %s", time.Since(started))

	// The learner's own sidecar cannot list members through its learner
	// (etcd refuses), so it falls back to the voters.
	g.Eventually(func(g Gomega) {
		l, err := tc.client(nm).Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		me := memberByName(l, nm.Name)
		g.Expect(me).NotTo(BeNil())
		g.Expect(me.IsLearner).To(BeTrue())
		g.Expect(l.Fingerprint).To(Equal(list.Fingerprint))
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())

	// Promote: refused as not ready while the learner catches up (etcd's
	// leader checks its log), then done; no time is asked of it.
	refusals := retryWhile(g, sidecar.ReasonLearnerNotReady, 90*time.Second, func() error {
		_, err := c.Promote(ctx, nm.Name, opts)
		return err
	})
	t.Logf("promoted %s after the learner's start, after %d LearnerNotReady refusals", time.Since(started), refusals)
	promoted := tc.membership(g, via)
	g.Expect(promoted).To(ContainElement(ContainSubstring(added.Member.ID + " name=etcd-new learner=false")))
	again, err = c.Promote(ctx, nm.Name, opts) // stale fingerprint: the effect is in place, so no refusal
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.Changed).To(BeFalse())
	g.Expect(tc.membership(g, via)).To(Equal(promoted))

	// Remove an old member that is neither the leader nor the one whose
	// sidecar we call.
	list, err = c.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	opts.Fingerprint = list.Fingerprint
	var target string
	for _, m := range tc.Members[1:] {
		if !memberByName(list, m.Name).IsLeader {
			target = m.Name
			break
		}
	}
	start = time.Now()
	unhealthy := retryWhile(g, sidecar.ReasonUnhealthyCluster, 30*time.Second, func() error {
		_, err := c.Remove(ctx, target, opts)
		return err
	})
	t.Logf("removed %s in %s, after %d UnhealthyCluster refusals", target, time.Since(start), unhealthy)
	removed := tc.membership(g, via)
	g.Expect(removed).To(HaveLen(3))
	g.Expect(removed).NotTo(ContainElement(ContainSubstring("name=" + target + " ")))
	again, err = c.Remove(ctx, target, opts)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.Changed).To(BeFalse())
	g.Expect(tc.membership(g, via)).To(Equal(removed))

	// The removed member's etcd exits; its sidecar turns unready but still
	// answers reads from the voters it knew.
	gone := tc.client(tc.Runtime.Member(target))
	g.Eventually(func(g Gomega) {
		g.Expect(gone.Ready(ctx)).NotTo(Succeed())
		l, err := gone.Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(memberByName(l, target)).To(BeNil())
		g.Expect(l.Members).To(HaveLen(3))
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())

	// Move leadership to the new member; a repeat finds it leading.
	list, err = c.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(memberByName(list, target)).To(BeNil())
	opts.Fingerprint = list.Fingerprint
	start = time.Now()
	moved, err := c.MoveLeader(ctx, nm.Name, opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("moved leadership to %s in %s", nm.Name, time.Since(start))
	g.Expect(moved.Changed).To(BeTrue())
	g.Eventually(func(g Gomega) {
		l, err := c.Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(leaderName(l)).To(Equal(nm.Name))
	}).WithTimeout(10 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	again, err = c.MoveLeader(ctx, nm.Name, opts)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.Changed).To(BeFalse())
	g.Expect(tc.membership(g, via)).To(Equal(removed))

	g.Expect(c.ReleaseLock(ctx, holder, "")).To(Succeed())
	g.Expect(c.ReleaseLock(ctx, holder, "")).To(Succeed()) // not held any more: still fine
	list, err = c.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(list.Lock).To(BeNil())
}

// retryWhile polls call until it succeeds, as long as it fails with the
// given reason (and fails the test on any other error), and returns how many
// times it was refused.
func retryWhile(g Gomega, reason string, timeout time.Duration, call func() error) int {
	refused := 0
	g.Eventually(func() error {
		err := call()
		if err != nil && !sidecar.IsReason(err, reason) {
			return StopTrying("failed for another reason than " + reason).Wrap(err)
		}
		if err != nil {
			refused++
		}
		return err
	}).WithTimeout(timeout).WithPolling(250 * time.Millisecond).Should(Succeed())
	return refused
}
