package sidecarcluster_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// These are unit tests of the decision logic on hand-made observations; the
// tests against real etcd are in execute_test.go and observe_test.go.

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func voter(id, name string, leader bool) sidecar.Member {
	return sidecar.Member{ID: id, Name: name, PeerURLs: []string{"https://" + name + ":2380"}, ClientURLs: []string{"https://" + name + ":2379"},
		IsLeader: leader, Healthy: true, HealthyForSeconds: 60}
}

func observation(at time.Time, ms ...sidecar.Member) *sidecarcluster.Observation {
	return &sidecarcluster.Observation{List: &sidecar.MemberList{Members: ms, Retired: []sidecar.RetiredMember{}}, At: at}
}

func want(names ...string) []planner.Want {
	var out []planner.Want
	for _, n := range names {
		out = append(out, planner.Want{Name: n, PeerURLs: []string{"https://" + n + ":2380"}, Side: "local"})
	}
	return out
}

// TestPlanHoldsChangesWhileAnOutcomeIsUnknown: after a step whose outcome is
// unknown, nothing else is done until an observation shows it or the settle
// time has passed; repeating the same step is allowed (it is idempotent).
func TestPlanHoldsChangesWhileAnOutcomeIsUnknown(t *testing.T) {
	c, err := sidecarcluster.New(sidecarcluster.Config{Holder: "ctl", Settle: 10 * time.Second})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	three := []sidecar.Member{voter("1", "m-0", true), voter("2", "m-1", false), voter("3", "m-2", false)}
	grow := sidecarcluster.Target{Add: want("m-0", "m-1", "m-2", "m-3")}
	shrink := sidecarcluster.Target{Add: want("m-0", "m-1"), Remove: []string{"m-2"}}
	addM3 := planner.Step{Kind: planner.AddLearner, Member: "m-3", PeerURLs: []string{"https://m-3:2380"}}
	removeM2 := planner.Step{Kind: planner.Remove, Member: "m-2", ID: "3"}

	for _, tc := range []struct {
		name     string
		obs      *sidecarcluster.Observation
		target   sidecarcluster.Target
		pending  *sidecarcluster.Pending
		wantKind planner.StepKind
		settled  bool
		applied  bool
	}{
		{"no pending step", observation(t0, three...), grow, nil, planner.AddLearner, false, false},
		{"an unknown add, planned again: allowed", observation(t0.Add(time.Second), three...), grow,
			&sidecarcluster.Pending{Step: addM3, At: t0}, planner.AddLearner, false, false},
		{"an unknown removal holds an add", observation(t0.Add(time.Second), three...), sidecarcluster.Target{Add: want("m-0", "m-1", "m-3"), Remove: []string{"m-2"}},
			&sidecarcluster.Pending{Step: removeM2, At: t0}, planner.Wait, false, false},
		{"an unknown add holds a removal", observation(t0.Add(time.Second), three...), shrink,
			&sidecarcluster.Pending{Step: addM3, At: t0}, planner.Wait, false, false},
		{"settled by time: not applied", observation(t0.Add(11*time.Second), three...), shrink,
			&sidecarcluster.Pending{Step: addM3, At: t0}, planner.Remove, true, false},
		{"settled by its effect", observation(t0.Add(time.Second), three[:2]...), sidecarcluster.Target{Add: want("m-0", "m-1")},
			&sidecarcluster.Pending{Step: removeM2, At: t0}, planner.Done, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			plan := c.Plan(tc.obs, tc.target, sidecarcluster.NewProgress(nil), tc.pending, planner.Policy{})
			g.Expect(plan.Step.Kind).To(Equal(tc.wantKind), "%s", plan.Step)
			if tc.wantKind == planner.Wait {
				g.Expect(plan.Step.Reason).To(HavePrefix("OutcomeUncertain"))
			}
			if tc.pending != nil {
				settled, applied := c.Settled(*tc.pending, tc.obs)
				g.Expect(settled).To(Equal(tc.settled))
				g.Expect(applied).To(Equal(tc.applied))
			}
		})
	}
}

// TestPlanAppliesRetirementRecords: records by another holder forbid adding
// the name; this holder's own records of wanted names are to be deleted;
// a removal of a departing member is a retirement, a stalled learner's is not.
func TestPlanAppliesRetirementRecords(t *testing.T) {
	g := NewWithT(t)
	c, err := sidecarcluster.New(sidecarcluster.Config{Holder: "seed-b"})
	g.Expect(err).NotTo(HaveOccurred())
	obs := observation(t0, voter("1", "m-0", true), voter("2", "m-1", false), voter("3", "m-2", false))
	obs.List.Retired = []sidecar.RetiredMember{{Name: "m-3", By: "seed-a"}, {Name: "m-0", By: "seed-b"}, {Name: "old", By: "seed-b"}}

	plan := c.Plan(obs, sidecarcluster.Target{Add: want("m-0", "m-1", "m-2", "m-3")}, sidecarcluster.NewProgress(nil), nil, planner.Policy{})
	g.Expect(plan.Desired.Retired).To(Equal([]string{"m-3"}))
	g.Expect(plan.Step.Kind).To(Equal(planner.Wait))
	g.Expect(plan.Step.Reason).To(HavePrefix("RetiredMember: m-3"))
	g.Expect(plan.Unretire).To(Equal([]string{"m-0"}), "old is not wanted: its record stays")

	plan = c.Plan(obs, sidecarcluster.Target{Add: want("m-0", "m-1"), Remove: []string{"m-2"}}, sidecarcluster.NewProgress(nil), nil, planner.Policy{})
	g.Expect(plan.Step.Kind).To(Equal(planner.Remove))
	g.Expect(plan.Retiring).To(BeTrue())

	stalled := observation(t0, voter("1", "m-0", true), voter("2", "m-1", false), voter("3", "m-2", false),
		sidecar.Member{ID: "4", PeerURLs: []string{"https://m-3:2380"}, IsLearner: true, Error: "not started"})
	progress := sidecarcluster.NewProgress([]sidecarcluster.LearnerProgress{{ID: "4", FirstSeen: t0.Add(-10 * time.Minute), LastAdvance: t0.Add(-10 * time.Minute)}})
	obs.List.Retired = nil
	plan = c.Plan(stalled, sidecarcluster.Target{Add: want("m-0", "m-1", "m-2", "m-3")}, progress, nil, planner.Policy{LearnerProgressTimeout: time.Minute})
	g.Expect(plan.Step.Kind).To(Equal(planner.Remove), "%s", plan.Step)
	g.Expect(plan.Step.Rule).To(Equal(planner.RuleStuckLearner))
	g.Expect(plan.Step.ID).To(Equal("4"))
	g.Expect(plan.Retiring).To(BeFalse(), "a stalled learner is added again later, not retired")
}

// TestProgressTracksLearners: an unstarted learner makes no progress from
// the moment it is seen; a growing index or being caught up is progress; a
// promoted learner is forgotten; progress survives a restart through the
// remembered entries.
func TestProgressTracksLearners(t *testing.T) {
	g := NewWithT(t)
	p := sidecarcluster.NewProgress(nil)
	unstarted := sidecar.Member{ID: "AB", PeerURLs: []string{"https://n:2380"}, IsLearner: true, BehindLeader: 5000}
	p.Observe(observation(t0, unstarted), 1000)
	g.Expect(p.NoProgressFor("ab", t0.Add(30*time.Second))).To(Equal(30 * time.Second))

	started := unstarted
	started.Name, started.Healthy, started.RaftIndex, started.BehindLeader = "n", true, 100, 4900
	p.Observe(observation(t0.Add(40*time.Second), started), 1000)
	g.Expect(p.NoProgressFor("ab", t0.Add(45*time.Second))).To(Equal(5 * time.Second))
	p.Observe(observation(t0.Add(50*time.Second), started), 1000)
	g.Expect(p.NoProgressFor("ab", t0.Add(50*time.Second))).To(Equal(10*time.Second), "same index, still behind: no progress")

	restarted := sidecarcluster.NewProgress(p.Learners())
	g.Expect(restarted.NoProgressFor("ab", t0.Add(50*time.Second))).To(Equal(10 * time.Second))
	caughtUp := started
	caughtUp.BehindLeader = 3
	restarted.Observe(observation(t0.Add(60*time.Second), caughtUp), 1000)
	g.Expect(restarted.NoProgressFor("ab", t0.Add(60*time.Second))).To(BeZero())
	l, ok := restarted.Learner("ab")
	g.Expect(ok).To(BeTrue())
	g.Expect(l.FirstSeen).To(Equal(t0))
	g.Expect(l.Name).To(Equal("n"))

	promoted := caughtUp
	promoted.IsLearner = false
	restarted.Observe(observation(t0.Add(70*time.Second), promoted), 1000)
	g.Expect(restarted.Learners()).To(BeEmpty())
}

func TestTie(t *testing.T) {
	m := func(side string, learner bool) planner.Member { return planner.Member{Side: side, Learner: learner} }
	for _, c := range []struct {
		name    string
		members []planner.Member
		tie     bool
	}{
		{"one side", []planner.Member{m("a", false), m("a", false), m("a", false)}, false},
		{"2:2", []planner.Member{m("a", false), m("a", false), m("b", false), m("b", false)}, true},
		{"2:1", []planner.Member{m("a", false), m("a", false), m("b", false)}, false},
		{"learners do not vote", []planner.Member{m("a", false), m("a", false), m("b", false), m("b", true)}, false},
		{"three sides, none above half", []planner.Member{m("a", false), m("b", false), m("c", false)}, true},
	} {
		t.Run(c.name, func(t *testing.T) { NewWithT(t).Expect(sidecarcluster.Tie(c.members)).To(Equal(c.tie)) })
	}
}

// TestInputTrustsOnlyAVotersTransport: the time a learner has been
// connected counts when the answering sidecar's member votes (it takes the
// step); a learner's own sidecar has no such view, and an unstarted
// learner is marked so.
func TestInputTrustsOnlyAVotersTransport(t *testing.T) {
	g := NewWithT(t)
	c, err := sidecarcluster.New(sidecarcluster.Config{Holder: "input"})
	g.Expect(err).NotTo(HaveOccurred())
	// Named as the controller names the learner its last step added.
	learner := sidecar.Member{ID: "b0", Name: "b-0", PeerURLs: []string{"https://b-0:2380"}, IsLearner: true, Error: "not started", ConnectedForSeconds: 7, Replicating: true, BehindAtLeader: true}
	a0 := voter("a0", "a-0", true)
	a0.ConnectedForSeconds = 60
	target := sidecarcluster.Target{Add: want("b-0"), Keep: []string{"a-0"}}

	for _, tc := range []struct {
		name         string
		transportOf  string
		connectedFor time.Duration
	}{
		{"a voter's view", "a0", 7 * time.Second},
		{"a learner's view", "b0", 0},
		{"no view", "", 0},
	} {
		obs := observation(t0, a0, learner)
		obs.List.TransportOf = tc.transportOf
		in := c.Input(obs, target, sidecarcluster.NewProgress(nil))
		g.Expect(in.Members).To(HaveLen(2))
		g.Expect(in.Members[1].Unstarted).To(BeTrue(), tc.name)
		g.Expect(in.Members[1].ConnectedFor).To(Equal(tc.connectedFor), tc.name)
		g.Expect(in.Members[1].Replicating).To(Equal(tc.connectedFor > 0), tc.name+": the leader's word on replication comes with its transport's")
		g.Expect(in.Members[1].BehindAtLeader).To(Equal(tc.connectedFor > 0), tc.name+": and its word on the log's share")
		g.Expect(in.Members[0].Unstarted).To(BeFalse(), tc.name)
	}
}

// TestInputTimesAVotersBreak: DownFor runs from the first observation
// that saw the member unhealthy, survives an observation that lists it
// not at all, and starts again after a healthy poll; the planner weighs it
// against its down-voter grace.
func TestInputTimesAVotersBreak(t *testing.T) {
	g := NewWithT(t)
	c, err := sidecarcluster.New(sidecarcluster.Config{Holder: "input"})
	g.Expect(err).NotTo(HaveOccurred())
	target := sidecarcluster.Target{Keep: []string{"a-0", "a-1"}}
	a0, up := voter("a0", "a-0", true), voter("a1", "a-1", false)
	down := up
	down.Healthy, down.HealthyForSeconds, down.Error, down.Unanswered = false, 0, "connection refused", true
	downFor := func(at time.Time, ms ...sidecar.Member) time.Duration {
		in := c.Input(observation(at, ms...), target, sidecarcluster.NewProgress(nil))
		for _, m := range in.Members {
			if m.ID == "a1" {
				return m.DownFor
			}
		}
		return -1
	}
	g.Expect(downFor(t0, a0, up)).To(BeZero(), "healthy")
	g.Expect(downFor(t0.Add(time.Second), a0, down)).To(BeZero(), "the break's first sight")
	g.Expect(downFor(t0.Add(11*time.Second), a0, down)).To(Equal(10 * time.Second))
	g.Expect(downFor(t0.Add(20*time.Second), a0)).To(Equal(time.Duration(-1)), "an observation without it")
	g.Expect(downFor(t0.Add(31*time.Second), a0, down)).To(Equal(30*time.Second), "still the same break")
	g.Expect(downFor(t0.Add(32*time.Second), a0, up)).To(BeZero(), "back")
	g.Expect(downFor(t0.Add(33*time.Second), a0, down)).To(BeZero(), "a new break")
}

// TestTiePlannedAtTheLeader: a promotion that makes a tie goes, with the
// removal that ends it, through the leader's sidecar when the observation
// came through it and the leader's own strict reconfiguration check counts
// the removal; observed through a follower's sidecar, the tie keeps to a
// follower (the leader's view is unknown there).
func TestTiePlannedAtTheLeader(t *testing.T) {
	g := NewWithT(t)
	c, err := sidecarcluster.New(sidecarcluster.Config{Holder: "ctl"})
	g.Expect(err).NotTo(HaveOccurred())
	member := func(id, name string, leader bool) sidecar.Member {
		m := voter(id, name, leader)
		m.ConnectedForSeconds = 60
		return m
	}
	learner := member("b4", "b-4", false)
	learner.IsLearner = true
	target := sidecarcluster.Target{
		Add:    []planner.Want{{Name: "b-3", PeerURLs: []string{"https://b-3:2380"}, Side: "b"}, {Name: "b-4", PeerURLs: []string{"https://b-4:2380"}, Side: "b"}},
		Remove: []string{"a-0", "a-1"},
		Side:   func(string) string { return "a" },
	}
	for _, tc := range []struct {
		name, via string
		atLeader  bool
	}{
		{"observed through the leader's sidecar", "a-0", true},
		{"observed through a follower's", "a-1", false},
	} {
		obs := observation(t0, member("a0", "a-0", true), member("a1", "a-1", false), member("b3", "b-3", false), learner)
		obs.Via = sidecarcluster.Endpoint{Member: tc.via}
		obs.List.TransportOf = obs.Member(tc.via).ID
		p := c.Plan(obs, target, sidecarcluster.NewProgress(nil), nil, planner.Policy{MinHealthyFor: 5 * time.Second, MaxLearners: 1})
		g.Expect(p.Step.Kind).To(Equal(planner.Promote), "%s: %s", tc.name, p.Step)
		g.Expect(p.ThenRemove).NotTo(BeNil(), "%s: the promotion makes the tie", tc.name)
		g.Expect(p.ThenRemove.Member).To(Equal("a-1"), tc.name)
		g.Expect(p.ThenRemoveAtLeader).To(Equal(tc.atLeader), tc.name)
	}
}
