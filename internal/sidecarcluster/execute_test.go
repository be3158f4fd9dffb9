package sidecarcluster_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestRoundsReplaceTheLeader replaces member a-0, the leader, by a new member
// b-0 in rounds of Observe, Plan and Execute on a real cluster, starting
// b-0 once it was added as a learner. It shows the lock taken with the
// first change (it was free at observation and nobody acted since, so the
// plan stands), the retirement record written before the removal, the
// removal sent through another member, the lock released at the end, and
// then the record deleted when the target wants a-0 again.
func TestRoundsReplaceTheLeader(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, "a", 3)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const holder = "seed-b"
	c := tc.newCluster(holder)

	// a-0 leads, so the replacement must move leadership before removing it.
	b0, eps, target := tc.replaceLeader(ctx, g)
	progress := sidecarcluster.NewProgress(nil)

	var (
		steps    []string
		results  []sidecarcluster.Result
		lastObs  *sidecarcluster.Observation
		retiring []bool
	)
	g.Eventually(func(g Gomega) {
		obs, err := c.Observe(ctx, eps, sidecarcluster.Hint{Departing: []string{"a-0"}})
		g.Expect(err).NotTo(HaveOccurred())
		lastObs = obs
		plan := c.Plan(obs, target, progress, nil, planner.Policy{})
		switch plan.Step.Kind {
		case planner.Done:
			g.Expect(c.ReleaseLock(ctx, obs)).To(Succeed())
			return
		case planner.Wait:
			g.Expect(plan.Step.Reason).To(HavePrefix("WaitingForLearner"), "the only wait in this move")
			startJoiner(ctx, g, tc, b0)
			g.Expect(false).To(BeTrue(), "waiting: %s", plan.Step.Reason)
		}
		res := c.Execute(ctx, obs, eps, plan)
		results = append(results, res)
		retiring = append(retiring, plan.Retiring)
		if res.Outcome == sidecarcluster.Succeeded {
			steps = append(steps, string(plan.Step.Kind)+" "+plan.Step.Member)
			if plan.Step.Kind == planner.AddLearner {
				startJoiner(ctx, g, tc, b0)
			}
		}
		g.Expect(false).To(BeTrue(), "executed %s: %s %v", plan.Step.Kind, res.Outcome, res.Err)
	}).WithTimeout(90 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())

	g.Expect(steps).To(HaveLen(4))
	g.Expect(steps[0]).To(Equal("AddLearner b-0"))
	g.Expect(steps[1]).To(Equal("Promote b-0"))
	g.Expect(steps[2]).To(And(HavePrefix("MoveLeader "), Not(HaveSuffix("a-0"))), "leadership leaves a-0 before its removal")
	g.Expect(steps[3]).To(Equal("Remove a-0"))
	// etcd may refuse that first add (its 5 s strict reconfiguration check
	// on a cluster just started); the call went out all the same.
	g.Expect(results[0].Reason).NotTo(Equal(sidecarcluster.ReasonLockAcquired))
	g.Expect(results[0].LockTaken).To(BeTrue(), "the first change takes the lock and goes out with it")
	for _, r := range results[1:] {
		g.Expect(r.LockTaken).To(BeFalse(), "later changes find the lock held")
	}
	for i, r := range results {
		if r.Step.Kind == planner.Remove && r.Outcome == sidecarcluster.Succeeded {
			g.Expect(r.Via.Member).NotTo(Equal("a-0"), "never through the member removed")
			g.Expect(retiring[i]).To(BeTrue())
		}
	}
	g.Expect(lastObs.List.Retired).To(Equal([]sidecar.RetiredMember{{Name: "a-0", By: holder}}))
	final := tc.memberList(g)
	g.Expect(final).To(HaveLen(3))
	g.Expect(strings.Join(final, " ")).To(And(ContainSubstring(":a-1:voter"), ContainSubstring(":a-2:voter"), ContainSubstring(":b-0:voter")))

	obs, err := c.Observe(ctx, eps, sidecarcluster.Hint{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.List.Lock).To(BeNil(), "released at Done")

	// Another holder sees a-0 as retired and does not add it back.
	other := tc.newCluster("seed-a")
	back := target
	back.Add = append([]planner.Want{{Name: "a-0", PeerURLs: []string{tc.Members[0].PeerURL}, Side: "a"}}, target.Add...)
	back.Remove = nil
	plan := other.Plan(obs, back, sidecarcluster.NewProgress(nil), nil, planner.Policy{})
	g.Expect(plan.Step.Kind).To(Equal(planner.Wait))
	g.Expect(plan.Step.Reason).To(HavePrefix("RetiredMember: a-0"))
	g.Expect(plan.Unretire).To(BeEmpty(), "the record is not seed-a's")

	// Its writer wants a-0 again (an aborted move): it deletes its record.
	plan = c.Plan(obs, back, sidecarcluster.NewProgress(nil), nil, planner.Policy{})
	g.Expect(plan.Unretire).To(Equal([]string{"a-0"}))
	g.Expect(c.Unretire(ctx, obs, plan)).To(Succeed())
	obs, err = c.Observe(ctx, eps, sidecarcluster.Hint{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.List.Retired).To(BeEmpty())
	plan = other.Plan(obs, back, sidecarcluster.NewProgress(nil), nil, planner.Policy{})
	g.Expect(plan.Step.Kind).To(Equal(planner.AddLearner), "now seed-a may add a-0 again: %s", plan.Step)
}

// TestRemovalThroughAFollowerOtherChangesThroughTheLeader executes steps with the cluster
// observed through the leader's sidecar and through a follower's: a
// removal, its lock and its retirement record go through the sidecar of
// the follower that is not removed (etcd's strict reconfiguration check
// runs on the member that takes the removal, and only the leader re-dates
// a new voter's connection after a snapshot join); any other change goes
// through the leader's sidecar, where it commits without a hop.
func TestRemovalThroughAFollowerOtherChangesThroughTheLeader(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, "l", 3)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := sidecar.NewClient(tc.Members[0].SidecarURL, tc.ClientTLS).MoveLeader(ctx, "l-0", sidecar.CallOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	before := tc.memberList(g)
	g.Expect(before).To(ContainElement(HaveSuffix(":l-2:voter")))
	c := tc.newCluster("ctl")

	// A promotion of a voter finds its effect in place: it changes
	// nothing, and shows where a change that is no removal goes.
	obs, err := c.Observe(ctx, tc.endpoints(), sidecarcluster.Hint{Healthy: []string{"l-1"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.Via.Member).To(Equal("l-1"), "the observation comes through a follower's sidecar")
	promote := planner.Step{Kind: planner.Promote, Member: "l-1", ID: obs.Member("l-1").ID}
	var res sidecarcluster.Result
	g.Eventually(func() sidecarcluster.Outcome {
		obs, err := c.Observe(ctx, tc.endpoints(), sidecarcluster.Hint{Healthy: []string{"l-1"}})
		g.Expect(err).NotTo(HaveOccurred())
		res = c.Execute(ctx, obs, tc.endpoints(), sidecarcluster.Plan{Step: promote})
		return res.Outcome
	}).WithContext(ctx).WithPolling(200 * time.Millisecond).Should(Equal(sidecarcluster.Succeeded))
	g.Expect(res.Via.Member).To(Equal("l-0"), "a change that is no removal goes to the leader's sidecar")
	g.Expect(res.Changed).To(BeFalse())
	g.Expect(tc.memberList(g)).To(Equal(before))

	remove := planner.Step{Kind: planner.Remove, Member: "l-2", Reason: "l-2 is departing"}
	var vias []string
	g.Eventually(func() sidecarcluster.Outcome {
		obs, err := c.Observe(ctx, tc.endpoints(), sidecarcluster.Hint{Healthy: []string{"l-0"}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(obs.Via.Member).To(Equal("l-0"), "the observation comes through the leader's sidecar")
		g.Expect(obs.Member("l-0").IsLeader).To(BeTrue())
		rm := remove
		rm.ID = obs.Member("l-2").ID
		res := c.Execute(ctx, obs, tc.endpoints(), sidecarcluster.Plan{Step: rm, Retiring: true})
		vias = append(vias, res.Via.Member)
		return res.Outcome
	}).WithContext(ctx).WithPolling(200 * time.Millisecond).Should(Equal(sidecarcluster.Succeeded))
	g.Expect(vias).To(HaveEach("l-1"), "every call of the removal, the lock's included, went to the follower's sidecar")
	g.Expect(tc.memberList(g)).To(ConsistOf(slices.DeleteFunc(before, func(m string) bool { return strings.HasSuffix(m, ":l-2:voter") })))
}

// startJoiner starts a learner that was just added, with the current
// members plus itself as its initial cluster, as a pod would.
func startJoiner(ctx context.Context, g Gomega, tc *testCluster, m *localetcd.Member) {
	if m.Running() {
		return
	}
	var ic []string
	for _, o := range tc.Runtime.Members() {
		if o != m && o.Running() {
			ic = append(ic, o.Name+"="+o.PeerURL)
		}
	}
	ic = append(ic, m.Name+"="+m.PeerURL)
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	g.Expect(m.Start(startCtx, strings.Join(ic, ","), localetcd.ClusterStateExisting)).To(Succeed())
}

// TestALockTakenAfterAnotherHolderActedPlansAgain observes the cluster
// with the lock free, lets another holder take the lock, write a
// retirement record and release the lock, and then executes the plan made
// from the observation: the lock is taken, the step is not sent
// (LockAcquired: plan again under it), and the membership is unchanged. A
// second observation, under the lock, plans again; its change goes out
// without a further round.
func TestALockTakenAfterAnotherHolderActedPlansAgain(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, "a", 3)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c := tc.newCluster("seed-b")
	_, eps, target := tc.replaceLeader(ctx, g)
	progress := sidecarcluster.NewProgress(nil)
	obs, err := c.Observe(ctx, eps, sidecarcluster.Hint{Departing: []string{"a-0"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.List.Lock).To(BeNil(), "the lock is free at observation")
	plan := c.Plan(obs, target, progress, nil, planner.Policy{})
	g.Expect(plan.Step.Kind).To(Equal(planner.AddLearner))

	// Another holder acts between the observation and the change.
	other := sidecar.NewClient(tc.Members[1].SidecarURL, tc.ClientTLS)
	token, err := sidecar.NewLockToken(time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	_, err = other.AcquireLock(ctx, "seed-a", token, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = other.Retire(ctx, "a-9", "seed-a", sidecar.CallOptions{LockHolder: "seed-a", LockToken: token})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(other.ReleaseLock(ctx, "seed-a", token)).To(Succeed())

	before := tc.memberList(g)
	res := c.Execute(ctx, obs, eps, plan)
	g.Expect(res.Outcome).To(Equal(sidecarcluster.Retry))
	g.Expect(res.Reason).To(Equal(sidecarcluster.ReasonLockAcquired), "%v", res.Err)
	g.Expect(res.LockTaken).To(BeFalse())
	g.Expect(tc.memberList(g)).To(Equal(before), "nothing was sent")

	// Planned again under the lock, the add goes out (once etcd's strict
	// reconfiguration check lets it, on a cluster just started).
	g.Eventually(func(g Gomega) {
		obs, err := c.Observe(ctx, eps, sidecarcluster.Hint{Departing: []string{"a-0"}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(obs.LockedBy("seed-b", c.Token())).To(BeTrue())
		g.Expect(obs.List.Retired).To(Equal([]sidecar.RetiredMember{{Name: "a-9", By: "seed-a"}}), "the new plan sees the record")
		plan := c.Plan(obs, target, progress, nil, planner.Policy{})
		g.Expect(plan.Step.Kind).To(Equal(planner.AddLearner))
		res := c.Execute(ctx, obs, eps, plan)
		g.Expect(res.Reason).NotTo(Equal(sidecarcluster.ReasonLockAcquired))
		g.Expect(res.LockTaken).To(BeFalse(), "the lock was held at this observation")
		g.Expect(res.Outcome).To(Equal(sidecarcluster.Succeeded), "%v", res.Err)
	}).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	g.Expect(tc.memberList(g)).To(ContainElement(HaveSuffix("::learner")), "b-0 was added (a learner has no name until it starts)")
}

// TestExecuteOutcomes shows how each kind of failure is classified, and that
// none of them changed the membership.
func TestExecuteOutcomes(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, "x", 3)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const holder = "ctl"
	before := tc.memberList(NewWithT(t))
	newcomer := planner.Step{Kind: planner.AddLearner, Member: "x-9", PeerURLs: []string{"https://127.0.0.1:9"}}
	promote := planner.Step{Kind: planner.Promote, Member: "x-1"}
	remove := planner.Step{Kind: planner.Remove, Member: "x-2"}
	// A change goes through the leader's sidecar, x-0's (the
	// observation's too), and a removal through the follower's that it
	// does not remove, x-1's: the faults below answer there.
	_, err := sidecar.NewClient(tc.Members[0].SidecarURL, tc.ClientTLS).MoveLeader(ctx, "x-0", sidecar.CallOptions{})
	if err != nil {
		t.Fatalf("moving leadership to x-0: %v", err)
	}

	for _, c := range []outcomeCase{
		{name: "5xx: outcome unknown", step: newcomer, outcome: sidecarcluster.Uncertain, reason: "Internal",
			fault: func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method == http.MethodPost && r.URL.Path == "/v1/members" {
					answer(w, 500, `{"reason":"Internal","message":"injected"}`)
					return true
				}
				return false
			}},
		{name: "no answer in time: outcome unknown", step: remove, faultAt: 1, outcome: sidecarcluster.Uncertain, reason: sidecarcluster.ReasonTransport,
			fault: func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/members/") {
					time.Sleep(1500 * time.Millisecond)
					answer(w, 200, `{}`)
					return true
				}
				return false
			}},
		{name: "learner not ready: retry after the hint", step: promote, outcome: sidecarcluster.Retry, reason: sidecar.ReasonLearnerNotReady, retryAfter: 3 * time.Second,
			fault: func(w http.ResponseWriter, r *http.Request) bool {
				if strings.HasSuffix(r.URL.Path, "/promote") {
					answer(w, 409, `{"reason":"LearnerNotReady","message":"injected","retryAfterSeconds":3}`)
					return true
				}
				return false
			}},
		{name: "quorum at risk: refused", step: remove, faultAt: 1, outcome: sidecarcluster.Refused, reason: sidecar.ReasonQuorumAtRisk,
			fault: func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/members/") {
					answer(w, 412, `{"reason":"QuorumAtRisk","message":"injected"}`)
					return true
				}
				return false
			}},
		{name: "a drain the departing member's sidecar refuses: retry, nothing removed", step: remove, faultAt: 2,
			outcome: sidecarcluster.Retry, reason: sidecarcluster.ReasonDrainFailed, retryAfter: time.Second,
			fault: func(w http.ResponseWriter, r *http.Request) bool {
				if r.URL.Path == "/v1/clients/drain" {
					answer(w, 503, `{"reason":"EtcdUnavailable","message":"injected"}`)
					return true
				}
				return false
			}},
		{name: "a stale plan: the real sidecar refuses, retry", step: remove, outcome: sidecarcluster.Retry, reason: sidecar.ReasonMembershipChanged,
			mutateObs: func(o *sidecarcluster.Observation) { o.List.Fingerprint = "0123456789abcdef" }},
		drainUndone(remove),
		{name: "the lock held by another: retry when it may expire", step: remove, outcome: sidecarcluster.Retry, reason: sidecar.ReasonLockHeld, retryAfter: time.Second,
			setup: func(g Gomega, c *sidecarcluster.Cluster) {
				cl := sidecar.NewClient(tc.Members[1].SidecarURL, tc.ClientTLS)
				g.Expect(cl.ReleaseLock(ctx, holder, c.Token())).To(Succeed())
				_, err := cl.AcquireLock(ctx, "someone-else", "", 20*time.Second)
				g.Expect(err).NotTo(HaveOccurred())
			}},
		{name: "a sidecar that is down: retry, nothing was sent", step: promote, outcome: sidecarcluster.Retry, reason: sidecarcluster.ReasonTransport, via: "dead"},
		{name: "a follower's sidecar that is down: retry, nothing was sent", step: remove, faultAt: 1, outcome: sidecarcluster.Retry, reason: sidecarcluster.ReasonTransport, via: "dead"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			cl := tc.newCluster(holder, func(cfg *sidecarcluster.Config) { cfg.CallTimeout = time.Second })
			admin := sidecar.NewClient(tc.Members[1].SidecarURL, tc.ClientTLS)
			// The lock is the Cluster's own (its process token), as if an
			// earlier round had taken it.
			_, err := admin.AcquireLock(ctx, holder, cl.Token(), 2*time.Minute)
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() {
				tc.fault(tc.Members[c.faultAt], nil)
				_ = admin.ReleaseLock(context.Background(), holder, cl.Token())
				_ = admin.ReleaseLock(context.Background(), "someone-else", "")
			})
			obs, err := cl.Observe(ctx, tc.endpoints(), sidecarcluster.Hint{Healthy: []string{"x-0"}})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(obs.Via.Member).To(Equal("x-0"))
			g.Expect(obs.Member("x-0").IsLeader).To(BeTrue(), "x-0 leads")
			if c.setup != nil {
				c.setup(g, cl)
			}
			if c.mutateObs != nil {
				c.mutateObs(obs)
			}
			eps := tc.endpoints()
			if c.via == "dead" {
				// Down since the observation: its failure is not known yet.
				eps[c.faultAt].URL = deadURL(t)
				if c.faultAt == 0 {
					obs.Via = eps[0]
				}
			}
			tc.fault(tc.Members[c.faultAt], c.fault)
			res := cl.Execute(ctx, obs, eps, sidecarcluster.Plan{Step: c.step})
			g.Expect(res.Outcome).To(Equal(c.outcome), "%v", res.Err)
			g.Expect(res.Reason).To(Equal(c.reason))
			g.Expect(res.RetryAfter).To(BeNumerically(">=", c.retryAfter))
			g.Expect(res.Err).To(HaveOccurred())
			g.Expect(res.Err.Error()).To(ContainSubstring(c.step.Member), "the error names the member")
			g.Expect(tc.memberList(g)).To(ConsistOf(before), "nothing changed")
			if c.check != nil {
				c.check(g)
			}
		})
	}
}

// outcomeCase is a case of TestExecuteOutcomes.
type outcomeCase struct {
	name       string
	step       planner.Step
	fault      func(w http.ResponseWriter, r *http.Request) bool
	faultAt    int // the member whose sidecar fault answers for
	setup      func(g Gomega, c *sidecarcluster.Cluster)
	mutateObs  func(o *sidecarcluster.Observation)
	via        string
	outcome    sidecarcluster.Outcome
	reason     string
	retryAfter time.Duration
	// check, when set, looks at what the faulty sidecar saw.
	check func(g Gomega)
}

// drainUndone is the case of TestExecuteOutcomes in which the departing
// member's gate drained and the removal was then refused: the drain is
// undone, so the member takes clients again instead of staying drained.
func drainUndone(remove planner.Step) (c outcomeCase) {
	var (
		mu    sync.Mutex
		calls []string
	)
	c.name, c.step, c.faultAt = "a removal refused after its drain: the drain is undone", remove, 2
	c.outcome, c.reason = sidecarcluster.Retry, sidecar.ReasonMembershipChanged
	c.mutateObs = func(o *sidecarcluster.Observation) { o.List.Fingerprint = "0123456789abcdef" }
	c.fault = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/v1/clients/drain" {
			return false
		}
		mu.Lock()
		calls = append(calls, r.Method)
		mu.Unlock()
		answer(w, 200, `{"ready":false,"inFlight":0}`)
		return true
	}
	c.check = func(g Gomega) {
		mu.Lock()
		defer mu.Unlock()
		g.Expect(calls).To(Equal([]string{http.MethodPost, http.MethodDelete}), "drained, then undone")
	}
	return c
}
