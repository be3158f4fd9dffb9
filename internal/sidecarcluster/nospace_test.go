package sidecarcluster_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestNoSpaceAlarmHoldsTheMove: etcd's NOSPACE alarm (a member's backend
// over its quota, as a full disk leaves it) raised between a plan and its
// change makes the change a Retry with the sidecar's reason NoSpace
// (nothing was sent, so it is not Uncertain); while it stays raised, the
// plan waits and names the alarm; etcd's member list stays as it was; once
// the alarm is disarmed the same change goes through.
func TestNoSpaceAlarmHoldsTheMove(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, "a", 3)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := tc.newCluster("seed-b")
	_, eps, target := tc.replaceLeader(ctx, g)
	plan := func(g Gomega) (*sidecarcluster.Observation, sidecarcluster.Plan) {
		obs, err := c.Observe(ctx, eps, sidecarcluster.Hint{Departing: []string{"a-0"}})
		g.Expect(err).NotTo(HaveOccurred())
		return obs, c.Plan(obs, target, sidecarcluster.NewProgress(nil), nil, planner.Policy{})
	}
	var (
		obs   *sidecarcluster.Observation
		first sidecarcluster.Plan
	)
	g.Eventually(func(g Gomega) {
		obs, first = plan(g)
		g.Expect(first.Step.Kind).To(Equal(planner.AddLearner), "the move's first change: %s", first.Step)
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

	disarm := tc.NoSpaceAlarm(g, tc.Members[1])

	before := tc.memberList(g)
	res := c.Execute(ctx, obs, eps, first)
	g.Expect(res.Outcome).To(Equal(sidecarcluster.Retry), "%v", res.Err)
	g.Expect(res.Reason).To(Equal(sidecar.ReasonNoSpace))
	g.Expect(res.Err).To(MatchError(ContainSubstring("NOSPACE alarm is raised")))
	g.Expect(tc.memberList(g)).To(Equal(before), "nothing changed under the alarm")
	g.Eventually(func(g Gomega) {
		_, p := plan(g)
		g.Expect(p.Step.Kind).To(Equal(planner.Wait))
		g.Expect(p.Step.Reason).To(And(HavePrefix("WaitingForHealthyCluster: voter "), ContainSubstring("NOSPACE")))
	}).WithTimeout(10 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	g.Expect(tc.memberList(g)).To(Equal(before))

	disarm()
	g.Eventually(func(g Gomega) {
		obs, p := plan(g)
		g.Expect(p.Step.Kind).To(Equal(planner.AddLearner), "%s", p.Step)
		res := c.Execute(ctx, obs, eps, p)
		g.Expect(res.Outcome).To(Equal(sidecarcluster.Succeeded), "%s: %v", res.Reason, res.Err)
	}).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	g.Expect(tc.memberList(g)).To(HaveLen(len(before) + 1))
}
