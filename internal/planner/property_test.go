package planner

import (
	"flag"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	propertySeed = flag.Int64("planner.seed", 0, "seed for TestPropertyRandomClusters (0: time-based)")
	propertyRuns = flag.Int("planner.runs", 5000, "random clusters TestPropertyRandomClusters plays through")
)

// simPolicy is the policy the model runs with; one simulated second passes
// per step. Each scenario draws its own MaxLearners (etcd's --max-learners)
// from 1 to 3.
var simPolicy = Policy{MinHealthyFor: 5 * time.Second, LearnerProgressTimeout: 20 * time.Second, MaxLearners: 1, DownVoterGrace: 8 * time.Second}

// simMember is a model etcd member with the faults the model plays.
type simMember struct {
	Member
	name      string // the name it will have once started (Name is empty until then)
	startIn   int    // steps until a new learner publishes itself and answers
	catchUpIn int    // steps until its log is caught up, counted from its add
	logReady  bool   // its log is caught up: etcd would promote it, started or not
	stuck     bool   // never catches up
	downFor   int    // steps of transient unhealthiness left
	// missedPoll: its latest poll timed out (a busy node), while its raft
	// stays connected and votes; it answers again at the next step.
	missedPoll bool
	dead       bool // never answers again
}

// sim is a model cluster that applies planner steps and checks every rule.
type sim struct {
	t       *testing.T
	rng     *rand.Rand
	desc    string // the scenario, printed when a check fails
	members []*simMember
	want    Desired
	policy  Policy
	nextID  int
	stuckOK map[string]bool // names whose first learner is stuck (rule 8 then retries)

	unmanagedAtStart map[string]Member
	twoSides         bool
	targetHolder     string // the side holding the majority in the target, "" if none
	// unstartedTies counts the ties made by promoting a learner that had
	// not published itself yet.
	unstartedTies int
	refused       bool // the target re-adds a retired name
	maxVoters     int  // the most voters rule 6 allows on the way

	configs  []config // one per voter configuration, in order
	steps    []string
	ruleSeen map[string]int
}

// config is one voter configuration the model went through.
type config struct {
	holder   string     // the side holding the majority, "" in a tie
	steps    []StepKind // the changes made in it; the last one left it
	election bool       // the model elected a new leader in it
	// downRemoved: entered by removing a voter that was down; the cut it makes
	// stall was there already, since the down voter could not vote either.
	downRemoved bool
	// departing counts the departing voters per side; staying the voters in
	// Add or Keep, which may take over leadership.
	departing, staying map[string]int
	// settledWaits counts the Waits planned in it while every voter had
	// been healthy for MinHealthyFor and a leader was there: nothing etcd
	// or the rules ask to wait for.
	settledWaits int
}

func TestPropertyRandomClusters(t *testing.T) {
	seed := *propertySeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (rerun with -planner.seed=%d)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	var totalSteps, maxSteps, twoSided, moves, ties, leaderMoves, unstartedTies int
	ruleSeen := map[string]int{}
	for run := 0; run < *propertyRuns && !t.Failed(); run++ {
		s := newScenario(t, rng)
		n := s.play()
		totalSteps += n
		maxSteps = max(maxSteps, n)
		for r, c := range s.ruleSeen {
			ruleSeen[r] += c
		}
		if s.twoSides {
			twoSided++
		}
		m, ti := s.majorityMoves()
		moves += m
		ties += ti
		leaderMoves += s.count(MoveLeader, 0, len(s.configs))
		unstartedTies += s.unstartedTies
	}
	t.Logf("%d clusters (%d on two sides), %d steps (longest run %d), %d majority moves through %d ties (%d made by promoting an unstarted learner), %d leader moves in all",
		*propertyRuns, twoSided, totalSteps, maxSteps, moves, ties, unstartedTies, leaderMoves)
	if *propertyRuns >= 1000 && unstartedTies == 0 {
		t.Errorf("no run promoted an unstarted learner into a tie: the model no longer reaches that case")
	}
	t.Logf("steps by rule: %v", ruleSeen)
}

// newScenario draws a cluster and a target: 2 or 3 sides, 1-7 members, random
// health, sometimes an unmanaged member, a learner left over, a retired name.
func newScenario(t *testing.T, rng *rand.Rand) *sim {
	s := &sim{t: t, rng: rng, stuckOK: map[string]bool{}, unmanagedAtStart: map[string]Member{}, ruleSeen: map[string]int{}, policy: simPolicy}
	s.policy.MaxLearners = 1 + rng.Intn(3)
	sides := []string{"a", "b", "c"}[:2+rng.Intn(2)]
	ordinal := map[string]int{}
	newName := func(side string) string {
		ordinal[side]++
		return fmt.Sprintf("%s-%d", side, ordinal[side]-1)
	}
	urls := func(name string) []string { return []string{"https://" + name + ":2380"} }
	var finalVoters int
	if rng.Intn(5) < 2 {
		// A whole move from one side to another, the case this project exists for.
		from, to := sides[0], sides[1]
		for range 1 + rng.Intn(7) {
			name := newName(from)
			s.addMember(name, from, urls(name))
			s.want.Remove = append(s.want.Remove, name)
		}
		for range 1 + rng.Intn(7) {
			name := newName(to)
			s.want.Add = append(s.want.Add, Want{Name: name, PeerURLs: urls(name), Side: to})
		}
	} else {
		for range 1 + rng.Intn(7) {
			side := sides[rng.Intn(len(sides))]
			name := newName(side)
			s.addMember(name, side, urls(name))
			switch r := rng.Intn(10); {
			case r < 2:
				s.want.Keep = append(s.want.Keep, name)
				finalVoters++
			case r < 5:
				s.want.Add = append(s.want.Add, Want{Name: name, PeerURLs: urls(name), Side: side})
				finalVoters++
			default:
				s.want.Remove = append(s.want.Remove, name)
			}
		}
		for range rng.Intn(7) {
			if finalVoters >= 7 {
				break
			}
			side := sides[rng.Intn(len(sides))]
			name := newName(side)
			s.want.Add = append(s.want.Add, Want{Name: name, PeerURLs: urls(name), Side: side})
			finalVoters++
		}
		if finalVoters == 0 {
			name := newName(sides[0])
			s.want.Add = append(s.want.Add, Want{Name: name, PeerURLs: urls(name), Side: sides[0]})
		}
	}
	if rng.Intn(4) == 0 {
		// Members wanted as learners only: a move's destination warming
		// its further members while the source's clients are switched.
		for range 1 + rng.Intn(2) {
			side := sides[rng.Intn(len(sides))]
			name := newName(side)
			s.want.Learners = append(s.want.Learners, Want{Name: name, PeerURLs: urls(name), Side: side})
		}
	}
	if rng.Intn(5) == 0 {
		side := sides[rng.Intn(len(sides))]
		name := "stranger-" + side
		m := s.addMember(name, side, urls(name))
		s.unmanagedAtStart[name] = m.Member
	}
	// Names retired earlier, and sometimes the departing ones too.
	s.want.Retired = append(s.want.Retired, "a-old-0")
	if len(s.want.Add) > 0 && rng.Intn(30) == 0 {
		// A target that was retired: the whole target is refused (rule 9).
		s.want.Retired = append(s.want.Retired, s.want.Add[rng.Intn(len(s.want.Add))].Name)
		s.refused = true
	}
	for _, n := range s.want.Remove {
		if rng.Intn(3) == 0 {
			s.want.Retired = append(s.want.Retired, n)
		}
	}
	voters := s.voters()
	voters[rng.Intn(len(voters))].Leader = true
	// A learner left over by an earlier run: a target still catching up, or a
	// departing learner.
	if rng.Intn(6) == 0 {
		for _, w := range s.want.Add {
			if s.find(w.Name) == nil {
				s.addLearner(w.Name, w.Side, w.PeerURLs)
				break
			}
		}
	} else if rng.Intn(10) == 0 {
		side := sides[rng.Intn(len(sides))]
		name := newName(side)
		m := s.addMember(name, side, urls(name))
		m.Learner, m.CaughtUp = true, false
		s.want.Remove = append(s.want.Remove, name)
	}
	for _, m := range s.members {
		m.HealthyFor = time.Duration(rng.Intn(30)) * time.Second
		m.ConnectedFor = m.HealthyFor + time.Duration(rng.Intn(3))*time.Second
		switch {
		case m.Leader:
		case slices.Contains(s.want.Remove, m.name) && !m.Learner && rng.Intn(8) == 0 && s.canFail(m):
			m.Healthy, m.dead = false, true
		case rng.Intn(6) == 0 && s.canFail(m):
			m.Healthy, m.downFor = false, 1+rng.Intn(3)
		}
		if !m.Healthy {
			m.HealthyFor, m.ConnectedFor = 0, 0
		}
	}
	s.twoSides = len(s.sidesUsed()) <= 2
	final := map[string]int{}
	for _, m := range s.voters() {
		if !slices.Contains(s.want.Remove, m.name) && !slices.ContainsFunc(s.want.Add, func(w Want) bool { return w.Name == m.name }) {
			final[m.Side]++
		}
	}
	for _, w := range s.want.Add {
		final[w.Side]++
	}
	s.targetHolder = holder(final)
	finalSize := 0
	for _, n := range final {
		finalSize += n
	}
	// Rule 6: n, n+1, n, ... never n, 2n, n. An even n grows to n+2 so that a
	// removal, not a catch-up, ends the tie.
	s.maxVoters = max(len(s.voters()), finalSize) + 2
	s.desc = fmt.Sprintf("start %s\nwant %+v", Describe(s.observe().Members), s.want)
	return s
}

// play runs the planner to Done and checks every step; it returns the steps taken.
func (s *sim) play() int {
	limit := 40 + 40*(len(s.want.Add)+len(s.want.Remove)+len(s.want.Learners))
	s.recordConfig()
	for step := 0; step < limit; step++ {
		obs := s.observe()
		st := Next(obs, s.want, s.policy)
		s.ruleSeen[st.Rule]++
		c := &s.configs[len(s.configs)-1]
		switch {
		case st.Kind == Wait && s.settled():
			c.settledWaits++
		case st.Kind != Wait && st.Kind != Done:
			c.steps = append(c.steps, st.Kind)
		}
		s.steps = append(s.steps, Describe(obs.Members)+"  =>  "+st.String())
		if s.refused {
			if st.Kind != Wait || st.Rule != RuleOwnership {
				s.fail("rule 9: a target with a retired name gave %s", st)
			}
			if step == 3 {
				return step + 1
			}
		}
		if st.Kind == Done {
			s.checkTarget()
			s.checkMajorityMoves()
			return step + 1
		}
		if st.Kind == Promote && slices.ContainsFunc(s.want.Learners, func(w Want) bool { return w.Name == s.nameOf(st) }) {
			s.fail("promoted %s, which is wanted as a learner only", s.nameOf(st))
		}
		s.apply(st)
		s.checkAfter(st)
		s.tick()
	}
	s.fail("no Done within %d steps", limit)
	return limit
}

func (s *sim) apply(st Step) {
	isRemoving := func(name string) bool { return slices.Contains(s.want.Remove, name) }
	var target *simMember
	if st.Kind != AddLearner && st.Kind != Wait {
		target = s.byID(st.ID)
		if target == nil {
			s.fail("%s names member %q (ID %q), which does not exist", st.Kind, st.Member, st.ID)
			return
		}
		if _, stranger := s.unmanagedAtStart[target.name]; stranger {
			s.fail("rule 7: %s touches unmanaged member %s", st.Kind, target.name)
		}
		if target.name != st.Member {
			s.fail("%s names %q but acts on %q", st.Kind, st.Member, target.name)
		}
	}
	downVoter := st.Kind == Remove && !target.Learner && !target.Healthy
	if downVoter && target.missedPoll {
		s.fail("rule 1: removed %s as down, yet it only missed a poll and its raft is connected", target.name)
	}
	if downVoter && len(s.voters())-1 < len(s.want.Add)+len(s.want.Keep) && target.DownFor < s.policy.DownVoterGrace {
		s.fail("rule 1: removed %s, down for %s of the %s grace, leaving fewer voters than the target", target.name, target.DownFor, s.policy.DownVoterGrace)
	}
	if st.Kind == AddLearner || st.Kind == Promote || (st.Kind == Remove && !downVoter) {
		s.checkHealthy(st)
	}
	switch st.Kind {
	case Wait:
	case AddLearner:
		if slices.Contains(s.want.Retired, st.Member) {
			s.fail("rule 9: retired %s added again", st.Member)
		}
		own := slices.Concat(s.want.Add, s.want.Learners)
		if !slices.ContainsFunc(own, func(w Want) bool { return w.Name == st.Member }) {
			s.fail("AddLearner %s, which is not a target", st.Member)
		}
		if s.find(st.Member) != nil {
			s.fail("AddLearner %s, which is a member already", st.Member)
		}
		side := ""
		for _, w := range own {
			if w.Name == st.Member {
				side = w.Side
			}
		}
		s.addLearner(st.Member, side, st.PeerURLs)
		if n := len(s.members) - len(s.voters()); n > s.policy.MaxLearners {
			s.fail("rule 2: %d learners, more than etcd's --max-learners %d", n, s.policy.MaxLearners)
		}
	case Promote:
		if target.Unstarted || target.missedPoll {
			// etcd's leader judges a learner that does not answer (yet) by
			// its log, and refuses it until that is caught up.
			if !target.Learner || target.ConnectedFor <= 0 {
				s.fail("rule 3: promoted %s, which does not answer, without its raft connected (%+v)", target.name, target.Member)
			}
			if !target.logReady {
				return // ErrLearnerNotReady: nothing changes
			}
			after := s.sideCounts()
			after[target.Side]++
			if target.Unstarted && holder(s.sideCounts()) != "" && holder(after) == "" {
				s.unstartedTies++
			}
		} else if !target.Learner || !target.Healthy || !target.CaughtUp {
			s.fail("rule 3: promoted %s that was not ready (%+v)", target.name, target.Member)
		}
		// A learner etcd does not count yet (connected for less than 5 s)
		// is promoted as any other: etcd puts no time on a promotion, and
		// rule 4's check at every removal below asserts that etcd would
		// take the removals after it.
		target.Learner = false
		s.recordConfig()
	case MoveLeader:
		if target.Learner || !target.Healthy {
			s.fail("MoveLeader to %s, which is a learner or down", target.name)
		}
		s.leader().Leader = false
		target.Leader = true
	case Remove:
		if target.Leader {
			s.fail("rule 5: removed the leader %s", target.name)
		}
		stuckLearner := target.Learner && target.stuck && target.NoProgressFor >= s.policy.LearnerProgressTimeout
		if !isRemoving(target.name) && !stuckLearner {
			s.fail("removed %s, which is neither departing nor a stuck learner", target.name)
		}
		s.members = slices.DeleteFunc(s.members, func(m *simMember) bool { return m == target })
		if !target.Learner {
			// etcd's strict reconfiguration check: the voters left that have been
			// connected for 5 s must form a quorum, or etcd refuses the removal.
			settled := 0
			for _, m := range s.voters() {
				// etcd counts started members connected for 5 s.
				if (m.Healthy || m.missedPoll) && m.ConnectedFor >= 5*time.Second {
					settled++
				}
			}
			if settled < quorum(len(s.voters())) {
				s.fail("rule 4: etcd would refuse %s: %d of %d voters left connected for 5 s", st, settled, len(s.voters()))
			}
			s.recordConfig()
			s.configs[len(s.configs)-1].downRemoved = !target.Healthy
		}
	default:
		s.fail("unknown step %q", st.Kind)
	}
}

// checkHealthy asserts rule 1 before a change: a leader, and every voter
// answering (only a departing voter that is down may be removed without,
// and a ready learner be promoted ahead of that removal, rule 1's
// exception), but for a voter that stays whose poll timed out while its
// raft has been connected for MinHealthyFor: it runs and votes. A learner,
// which has no vote, may also be added while such a voter has been
// connected for less.
func (s *sim) checkHealthy(st Step) {
	for _, m := range s.voters() {
		stays := !slices.Contains(s.want.Remove, m.name)
		connected := m.missedPoll && m.ConnectedFor >= s.policy.MinHealthyFor && stays
		// The leader's word that its raft runs, for one that stays.
		replicated := s.replicates(m) && stays && (m.missedPoll || m.Unstarted)
		joining := st.Kind == AddLearner && stays && m.ConnectedFor > 0 && (m.missedPoll || m.Unstarted)
		healing := st.Kind == Promote && st.Rule == RuleHealthyCluster && !stays
		if !m.Healthy && !s.runsUnstarted(m) && !connected && !replicated && !joining && !healing {
			s.fail("rule 1: %s while voter %s is down", st, m.name)
		}
	}
	if s.leader() == nil {
		s.fail("rule 1: %s without a leader", st)
	}
}

// checkAfter asserts rule 4 after every step (the model's own faults never take
// the healthy voters below a quorum, so only a step could) and the size bound
// of rule 6.
func (s *sim) checkAfter(st Step) {
	voters, healthy := s.voters(), 0
	for _, m := range voters {
		// A voter promoted before it published itself commits with the
		// others: its raft is connected and its log was caught up.
		if m.Healthy || m.missedPoll || (m.Unstarted && m.ConnectedFor > 0 && m.logReady) {
			healthy++
		}
	}
	if healthy < quorum(len(voters)) {
		s.fail("rule 4: after %s, %d healthy of %d voters", st, healthy, len(voters))
	}
	if len(voters) > s.maxVoters {
		s.fail("rule 6: after %s, %d voters, more than the %d allowed", st, len(voters), s.maxVoters)
	}
}

// tick lets one second pass: learners start and catch up, faults come and heal.
func (s *sim) tick() {
	for _, m := range s.members {
		if m.missedPoll {
			m.missedPoll, m.Healthy, m.Problem, m.Unanswered = false, true, "", false
		}
		switch {
		case m.dead:
		case m.downFor > 0:
			m.downFor--
			if m.downFor == 0 {
				m.Healthy, m.HealthyFor, m.ConnectedFor, m.Unanswered = true, 0, 0, false
				if m.Unstarted {
					m.Healthy = false // it comes back connected, still to publish itself
				}
			}
		default:
			if m.Learner && m.catchUpIn > 0 && !m.stuck {
				m.catchUpIn--
				m.logReady = m.catchUpIn == 0
			}
			if m.Unstarted && m.startIn > 0 {
				m.startIn--
				if m.startIn == 0 && !m.stuck {
					m.Name, m.Healthy, m.Unstarted = m.name, true, false
				}
			}
		}
		if !m.dead && m.downFor == 0 {
			m.ConnectedFor += time.Second
		}
		m.CaughtUp = m.Learner && m.Healthy && m.logReady
		if m.Healthy {
			m.HealthyFor += time.Second
			m.DownFor = 0
		} else {
			m.DownFor += time.Second
		}
		if m.Learner && !m.CaughtUp && (m.stuck || !m.Healthy) {
			m.NoProgressFor += time.Second
		} else {
			m.NoProgressFor = 0
		}
	}
	if s.rng.Intn(12) != 0 {
		return
	}
	m := s.members[s.rng.Intn(len(s.members))]
	if !m.Healthy {
		return
	}
	if s.rng.Intn(3) == 0 && m.ConnectedFor > 0 {
		// A poll that timed out: the planner sees no health, the
		// transport still has the member connected, and quorum is whole.
		m.missedPoll, m.Healthy, m.HealthyFor, m.Problem, m.Unanswered = true, false, 0, "context deadline exceeded", true
		return
	}
	if !s.canFail(m) {
		return
	}
	m.Healthy, m.downFor, m.ConnectedFor, m.Unanswered = false, 1+s.rng.Intn(3), 0, true
	if m.Leader {
		var others []*simMember
		for _, v := range s.voters() {
			if v.Healthy {
				others = append(others, v)
			}
		}
		if len(others) == 0 {
			m.Healthy, m.downFor = true, 0
			return
		}
		m.Leader = false
		others[s.rng.Intn(len(others))].Leader = true
		s.configs[len(s.configs)-1].election = true
	}
}

// settled reports whether there is a leader and every voter has been
// healthy for MinHealthyFor, or runs without having published itself.
func (s *sim) settled() bool {
	for _, m := range s.voters() {
		if s.runsUnstarted(m) {
			continue
		}
		if !m.Healthy || max(m.HealthyFor, m.ConnectedFor) < s.policy.MinHealthyFor {
			return false
		}
	}
	return s.leader() != nil
}

// replicates reports whether the leader's raft replicates to m, as the
// leader's sidecar would report it: m runs (neither dead nor down), its
// raft is connected, and its log is caught up.
func (s *sim) replicates(m *simMember) bool {
	return !m.Leader && !m.dead && m.downFor == 0 && m.ConnectedFor > 0 && !m.stuck && (m.logReady || !m.Learner)
}

// runsUnstarted reports whether voter m, promoted before it published
// itself, takes part in raft: connected for MinHealthyFor with its log
// caught up. It answers no poll, but it is not down.
func (s *sim) runsUnstarted(m *simMember) bool {
	return !m.Healthy && m.Unstarted && m.logReady && m.ConnectedFor >= s.policy.MinHealthyFor
}

// canFail reports whether m may go down without the model itself breaking quorum.
func (s *sim) canFail(m *simMember) bool {
	if m.Learner {
		return true
	}
	voters, healthy := s.voters(), 0
	for _, v := range voters {
		if v.Healthy {
			healthy++
		}
	}
	return healthy-1 >= quorum(len(voters))
}

// checkTarget asserts that Done means the target: targets are voters, departing
// members are gone, kept and unmanaged members are there as they were.
func (s *sim) checkTarget() {
	for _, w := range s.want.Add {
		if m := s.find(w.Name); m == nil || m.Learner {
			s.fail("Done but target %s is not a voter", w.Name)
		}
	}
	for _, n := range s.want.Remove {
		if s.find(n) != nil {
			s.fail("Done but departing %s is still a member", n)
		}
	}
	for _, n := range s.want.Keep {
		if s.find(n) == nil {
			s.fail("kept member %s was removed", n)
		}
	}
	learners := 0
	for _, m := range s.members {
		if m.Learner {
			learners++
		}
	}
	for _, w := range s.want.Learners {
		m := s.find(w.Name)
		switch {
		case m != nil && !m.Learner:
			s.fail("Done but %s, wanted as a learner only, votes", w.Name)
		case m == nil && learners < s.policy.MaxLearners:
			s.fail("Done but %s, wanted as a learner only, is not a member and a learner slot is free (%d of %d taken)", w.Name, learners, s.policy.MaxLearners)
		}
	}
	for name, before := range s.unmanagedAtStart {
		if m := s.find(name); m == nil || m.Learner != before.Learner {
			s.fail("rule 7: unmanaged member %s was changed", name)
		}
	}
}

// majorityMoves counts, in a two-sided run, the moves of the majority from one
// side to the other and the tied configurations they passed through.
func (s *sim) majorityMoves() (moves, ties int) {
	s.eachMajorityMove(func(_, from, to int) {
		moves++
		ties += to - from - 1
	})
	return moves, ties
}

// checkMajorityMoves asserts rule 6 for two-sided runs: each move of the
// majority passes through at most one tie and moves the leader at most once.
// On a move toward the target's majority side, a tie that a removal can end is
// ended by one, with no add or promotion in between.
func (s *sim) checkMajorityMoves() {
	s.eachMajorityMove(func(runStart, from, to int) {
		name := fmt.Sprintf("the majority moved %s -> %s", s.configs[from].holder, s.configs[to].holder)
		// A fault may move the majority on its own: an election, or a down
		// voter's removal (rule 1) that tips the sides. The leader moves made
		// before it served the move the planner was making, not this one.
		elected := slices.ContainsFunc(s.configs[runStart:to], func(c config) bool { return c.election })
		faulted := slices.ContainsFunc(s.configs[runStart:to+1], func(c config) bool { return c.election || c.downRemoved })
		if n := s.count(MoveLeader, runStart, to); n > 1 && !faulted {
			s.fail("rule 6: %s with %d leader moves", name, n)
		}
		if tied := to - from - 1; tied > 1 {
			s.fail("rule 6: %s through %d tied configurations", name, tied)
		}
		if s.configs[to].holder != s.targetHolder || s.configs[from+1].downRemoved || s.configs[from+1].departing[s.configs[from].holder] == 0 {
			return // not a move toward the target's majority, or no removal could end this tie
		}
		// The tie is not held: with every voter settled, the removal that
		// ends it is the next step, whatever the learners are doing.
		if w := s.configs[from+1].settledWaits; w > 0 {
			s.fail("rule 6: %s, holding the tie for %d step(s) with every voter settled", name, w)
		}
		for _, k := range s.configs[from+1].steps {
			if k != Remove && k != MoveLeader {
				s.fail("rule 6: %s with a %s during the tie", name, k)
			}
			// Leadership moves before the tie or right after it, never in it,
			// unless the incoming side had no voter then that stays.
			if k == MoveLeader && s.configs[from].staying[s.targetHolder] > 0 && !elected {
				s.fail("rule 6: %s moving the leader during the tie", name)
			}
		}
		if entered := s.configs[to-1].steps; entered[len(entered)-1] != Remove {
			s.fail("rule 6: %s by a %s, not a removal", name, entered[len(entered)-1])
		}
	})
}

// eachMajorityMove calls f for each move of the majority in a two-sided run:
// with the first and the last configuration in which one side held it, and the
// first in which the other side does.
func (s *sim) eachMajorityMove(f func(start, from, to int)) {
	if !s.twoSides {
		return
	}
	start, last := -1, -1
	for i, c := range s.configs {
		if c.holder == "" {
			continue
		}
		switch {
		case last < 0:
			start = i
		case s.configs[last].holder != c.holder:
			f(start, last, i)
			start = i
		}
		last = i
	}
}

// count counts the steps of a kind made in configurations [from, to).
func (s *sim) count(kind StepKind, from, to int) int {
	n := 0
	for _, c := range s.configs[from:to] {
		for _, k := range c.steps {
			if k == kind {
				n++
			}
		}
	}
	return n
}

func (s *sim) recordConfig() {
	counts, departing, staying := map[string]int{}, map[string]int{}, map[string]int{}
	for _, m := range s.voters() {
		counts[m.Side]++
		switch {
		case slices.Contains(s.want.Remove, m.name):
			departing[m.Side]++
		case slices.Contains(s.want.Keep, m.name) || slices.ContainsFunc(s.want.Add, func(w Want) bool { return w.Name == m.name }):
			staying[m.Side]++
		}
	}
	s.configs = append(s.configs, config{holder: holder(counts), departing: departing, staying: staying})
}

func (s *sim) observe() Observed {
	var obs Observed
	// Half the observations come through the leader's sidecar, which
	// tells whose raft its own replicates to.
	viaLeader := s.leader() != nil && s.rng.Intn(2) == 0
	for _, m := range s.members {
		pm := m.Member
		pm.Replicating = viaLeader && s.replicates(m)
		obs.Members = append(obs.Members, pm)
	}
	s.rng.Shuffle(len(obs.Members), func(i, j int) { obs.Members[i], obs.Members[j] = obs.Members[j], obs.Members[i] })
	return obs
}

func (s *sim) addMember(name, side string, urls []string) *simMember {
	s.nextID++
	m := &simMember{Member: Member{ID: fmt.Sprintf("%x", 0x1000+s.nextID), Name: name, PeerURLs: urls, Side: side, Healthy: true}, name: name}
	s.members = append(s.members, m)
	return m
}

// addLearner adds a learner whose raft connects at once and whose log is
// caught up after one to eight steps, while it is unstarted (no name, not
// answering) for one to twelve: etcd publishes a member only after its
// snapshot, and retries a lost publish after its request timeout. Learners
// added side by side so get ready in any order. The first learner of a
// name is sometimes stuck: its log never catches up and it never publishes.
func (s *sim) addLearner(name, side string, urls []string) {
	m := s.addMember(name, side, urls)
	m.Name, m.Healthy, m.Learner, m.Unstarted = "", false, true, true
	m.startIn, m.catchUpIn = 1+s.rng.Intn(12), 1+s.rng.Intn(8)
	if _, tried := s.stuckOK[name]; !tried {
		s.stuckOK[name] = true
		m.stuck = s.rng.Intn(10) == 0
	}
}

func (s *sim) voters() []*simMember {
	var vs []*simMember
	for _, m := range s.members {
		if !m.Learner {
			vs = append(vs, m)
		}
	}
	return vs
}

func (s *sim) leader() *simMember {
	for _, m := range s.members {
		if m.Leader {
			return m
		}
	}
	s.fail("no leader in the model")
	return nil
}

// nameOf is the name of the member step st acts on, also for an unstarted
// learner that st addresses by ID.
func (s *sim) nameOf(st Step) string {
	if m := s.byID(st.ID); m != nil {
		return m.name
	}
	return st.Member
}

func (s *sim) find(name string) *simMember {
	for _, m := range s.members {
		if m.name == name {
			return m
		}
	}
	return nil
}

func (s *sim) byID(id string) *simMember {
	for _, m := range s.members {
		if m.ID == id {
			return m
		}
	}
	return nil
}

func (s *sim) sidesUsed() map[string]bool {
	used := map[string]bool{}
	for _, m := range s.members {
		used[m.Side] = true
	}
	for _, w := range s.want.Add {
		used[w.Side] = true
	}
	return used
}

func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	steps := s.steps
	if len(steps) > 80 {
		steps = append(append(slices.Clip(steps[:30]), "..."), steps[len(steps)-40:]...)
	}
	s.t.Fatalf("%s\n%s\nsteps:\n  %s", fmt.Sprintf(format, args...), s.desc, strings.Join(steps, "\n  "))
}

// sideCounts counts the voters per side.
func (s *sim) sideCounts() map[string]int {
	counts := map[string]int{}
	for _, m := range s.voters() {
		counts[m.Side]++
	}
	return counts
}
