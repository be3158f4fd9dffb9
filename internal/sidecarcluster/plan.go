package sidecarcluster

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// ReasonChangeInFlight starts the reason of a Wait while another process's
// membership change is in flight (its step record is open).
const ReasonChangeInFlight = sidecar.ReasonChangeInFlight

// Target is the membership the caller wants, split by ownership, before the
// retirement records in etcd are applied.
type Target struct {
	// Add are the members the caller owns and wants as voters.
	Add []planner.Want
	// Learners are members the caller owns and wants joined as learners
	// only (planner.Desired.Learners).
	Learners []planner.Want
	// Keep are members that must stay but are not the caller's to change.
	Keep []string
	// Remove are members the caller retires: its departing members and the
	// external members its policy retires.
	Remove []string
	// Side gives the side of an observed member that is not in Add (kept,
	// departing or unmanaged); nil puts them on side "".
	Side func(name string) string
}

// Own are the members the caller owns: those it wants as voters, then
// those it wants as learners only.
func (t Target) Own() []planner.Want { return slices.Concat(t.Add, t.Learners) }

// Plan is one decision: the step, and what it was decided from.
type Plan struct {
	// Step is the planner's step, or a Wait this package put in its place
	// (OutcomeUncertain).
	Step planner.Step
	// Input is the planner's view of the observation.
	Input planner.Observed
	// Desired is the target with Retired filled from the records of other
	// holders.
	Desired planner.Desired
	// Retiring says the step removes a member for good (one in
	// Target.Remove): a retirement record is written before the removal.
	Retiring bool
	// ThenRemove is, for a promotion that leaves the voters in a tie (no
	// side holds a majority), the removal the planner decides right after
	// it, from the membership as it will be. Execute sends both in one
	// sidecar call that prepares the removal before the promotion, so the
	// tie lasts the removal's commit instead of a round of observing and
	// planning (rule 6: keep the tie to the time of one removal).
	// ThenRetiring is Retiring for that removal.
	ThenRemove   *planner.Step
	ThenRetiring bool
	// ThenRemoveAtLeader says the leader's own strict reconfiguration
	// check counts enough voters for ThenRemove right after the promotion,
	// as the leader's sidecar saw its transport: the tie then goes through
	// the leader's sidecar, where both changes commit without crossing to
	// another member first, instead of through a follower (removalVia).
	ThenRemoveAtLeader bool
	// Unretire are members whose retirement records this holder wrote and
	// that the target now wants (Add or Keep): the records must go so that
	// the member may join again.
	Unretire []string
}

// IsChange reports whether the step changes the cluster.
func (p Plan) IsChange() bool { return IsChange(p.Step.Kind) }

// IsChange reports whether a step of this kind changes the cluster.
func IsChange(k planner.StepKind) bool {
	return k == planner.AddLearner || k == planner.Promote || k == planner.MoveLeader || k == planner.Remove
}

// Plan decides the next step from an observation. It updates progress with
// the observed learners first (learner progress lives across rounds), and
// holds every other change while pending, an earlier step with an unknown
// outcome, is not settled: nothing is acted on from a view that may not show
// that step yet.
func (c *Cluster) Plan(obs *Observation, t Target, progress *Progress, pending *Pending, policy planner.Policy) Plan {
	progress.Observe(obs, c.cfg.MaxLearnerLag)
	p := Plan{Input: c.Input(obs, t, progress)}
	p.Desired = planner.Desired{Add: t.Add, Learners: t.Learners, Keep: t.Keep, Remove: t.Remove}
	wanted := map[string]bool{}
	for _, w := range t.Own() {
		wanted[w.Name] = true
	}
	for _, n := range t.Keep {
		wanted[n] = true
	}
	for _, r := range obs.List.Retired {
		switch {
		case r.By != c.cfg.Holder:
			// Ownership (rule 9): what another holder retired is not ours to
			// bring back.
			p.Desired.Retired = append(p.Desired.Retired, r.Name)
		case wanted[r.Name]:
			p.Unretire = append(p.Unretire, r.Name)
		}
	}
	p.Step = planner.Next(p.Input, p.Desired, policy)
	if pending != nil {
		if settled, _ := c.Settled(*pending, obs); !settled && !sameStep(p.Step, pending.Step) {
			p.Step = planner.Step{Kind: planner.Wait, Rule: planner.RuleHealthyCluster,
				Reason: fmt.Sprintf("OutcomeUncertain: the outcome of %s %s (%s ago) does not show yet; nothing else changes until it does or %s have passed",
					pending.Step.Kind, stepTarget(pending.Step), obs.At.Sub(pending.At).Round(time.Second), c.cfg.Settle)}
		}
	}
	if rec := obs.List.Step; rec != nil && rec.State == sidecar.StepInFlight && p.IsChange() &&
		(rec.Holder != c.cfg.Holder || rec.Token != c.token) {
		// Another process's change is on the wire (or its sidecar died with
		// it, until the record's lease ends): its effect may not show yet.
		p.Step = planner.Step{Kind: planner.Wait, Rule: planner.RuleHealthyCluster,
			Reason: fmt.Sprintf("%s: %s %s sent by %s (token %s) through the sidecar of member %s is in flight since etcd revision %d; nothing else changes until it ended",
				ReasonChangeInFlight, rec.Kind, rec.Target, cmp.Or(rec.Holder, "a caller without the lock"), cmp.Or(rec.Token, "none"), rec.Sidecar, rec.Revision)}
	}
	p.Retiring = p.Step.Kind == planner.Remove && slices.Contains(t.Remove, p.Step.Member)
	if p.Step.Kind == planner.Promote && pending == nil {
		after := planner.Observed{Members: projectPromotion(p.Input.Members, p.Step)}
		if Tie(after.Members) {
			if next := planner.Next(after, p.Desired, policy); next.Kind == planner.Remove {
				p.ThenRemove = &next
				p.ThenRetiring = slices.Contains(t.Remove, next.Member)
				p.ThenRemoveAtLeader = leaderCountsRemoval(obs, after.Members, next, policy.MinHealthyFor)
			}
		}
	}
	return p
}

// leaderCountsRemoval tells whether the removal rm, sent to the leader
// with the voters as in ms, passes the leader's strict reconfiguration
// check (etcd's mayRemoveMember): the voters its transport has had
// connected for minConnected, itself included and the member removed
// counted, less one, make a quorum of the voters but one. Only an
// observation through the leader's sidecar tells: ConnectedFor is then the
// leader's view (Input), the one that check reads. A leader re-dates a
// voter's connection when the voter applies a snapshot, so right after a
// snapshot join it counts less than a follower would.
func leaderCountsRemoval(obs *Observation, ms []planner.Member, rm planner.Step, minConnected time.Duration) bool {
	via := obs.Member(obs.Via.Member)
	if via == nil || !via.IsLeader || !strings.EqualFold(obs.List.TransportOf, via.ID) || minConnected <= 0 {
		return false
	}
	voters, active := 0, 0
	for _, m := range ms {
		if m.Learner {
			continue
		}
		voters++
		if strings.EqualFold(m.ID, via.ID) || m.ConnectedFor >= minConnected {
			active++
		}
		if strings.EqualFold(m.ID, rm.ID) && m.Leader {
			return false // rule 5: never the leader, and never through it
		}
	}
	return active-1 >= 1+(voters-1)/2
}

// projectPromotion is the membership right after the promotion s.
func projectPromotion(ms []planner.Member, s planner.Step) []planner.Member {
	out := slices.Clone(ms)
	for i := range out {
		if (s.ID != "" && strings.EqualFold(out[i].ID, s.ID)) || (s.ID == "" && out[i].Name == s.Member) {
			out[i].Learner = false
		}
	}
	return out
}

// Input turns an observation into the planner's input. A learner counts as
// caught up when it answers and is at most MaxLearnerLag entries behind the
// leader; its NoProgressFor comes from progress. One that has not published
// itself is Unstarted: the planner then goes by how long the sidecar's
// member has had it connected, and etcd's leader checks its log.
func (c *Cluster) Input(obs *Observation, t Target, progress *Progress) planner.Observed {
	sides := map[string]string{}
	for _, w := range t.Own() {
		sides[w.Name] = w.Side
	}
	// ConnectedFor is the view of the answering sidecar's own member, and
	// that member takes the step (Execute sends it there): it is evidence
	// only when that member votes. A learner's sidecar (its member serves
	// no membership call) sends the step to a voter, whose view it lacks.
	transportVotes := false
	for _, m := range obs.List.Members {
		if obs.List.TransportOf != "" && strings.EqualFold(m.ID, obs.List.TransportOf) && !m.IsLearner {
			transportVotes = true
		}
	}
	var in planner.Observed
	for _, m := range obs.List.Members {
		side, owned := sides[m.Name]
		if !owned && t.Side != nil && m.Name != "" {
			side = t.Side(m.Name)
		}
		pm := planner.Member{
			ID:         m.ID,
			Name:       m.Name,
			PeerURLs:   slices.Clone(m.PeerURLs),
			Side:       side,
			Learner:    m.IsLearner,
			Leader:     m.IsLeader,
			Healthy:    m.Healthy,
			Problem:    m.Error,
			Unanswered: m.Unanswered,
			CaughtUp:   m.Healthy && (!m.IsLearner || m.BehindLeader <= c.cfg.MaxLearnerLag),
			HealthyFor: time.Duration(m.HealthyForSeconds * float64(time.Second)),
			// Not by its name: the controller names the learner its last
			// step added before etcd does (nameUnstartedLearner).
			Unstarted: len(m.ClientURLs) == 0,
		}
		if transportVotes {
			pm.ConnectedFor = time.Duration(m.ConnectedForSeconds * float64(time.Second))
			// Only the leader's sidecar reports them, from its own raft.
			pm.Replicating, pm.BehindAtLeader = m.Replicating, m.BehindAtLeader
		}
		if !m.Healthy && !m.IsLearner && pm.ConnectedFor > 0 && c.wasDrained(m.ID, obs.At) {
			// Its gate was closed for a removal that did not follow (see
			// noteDrained): its raft runs and votes.
			pm.Healthy, pm.CaughtUp = true, true
			pm.Problem = "its clients were drained for its removal, so it answers no poll; its raft is connected"
		}
		if m.IsLearner {
			pm.NoProgressFor = progress.NoProgressFor(m.ID, obs.At)
			pm.ConfiguredFor = obs.Configured[strings.ToLower(m.ID)]
		}
		pm.DownFor = c.downFor(m.ID, pm.Healthy, obs.At)
		in.Members = append(in.Members, pm)
	}
	return in
}

// downFor is how long member id has been unhealthy without a break, as
// this Cluster's observations saw it: 0 at the first sight of a break, so
// a restarted controller waits a whole grace again rather than less.
func (c *Cluster) downFor(id string, healthy bool, at time.Time) time.Duration {
	id = strings.ToLower(id)
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, b := range c.down {
		if at.Sub(b.seen) > downMemory {
			delete(c.down, k) // a member not observed for long: removed
		}
	}
	if healthy || id == "" {
		delete(c.down, id)
		return 0
	}
	b, ok := c.down[id]
	if !ok || b.since.After(at) {
		b.since = at
	}
	b.seen = at
	c.down[id] = b
	return at.Sub(b.since)
}

// downMemory is how long a break of a member no longer observed is
// remembered: an observation that misses a member (an answer from
// another sidecar) does not end its break.
const downMemory = time.Hour

// Tie reports whether the voters are split so that no side holds a
// majority: a cut between the sides would stop every write. A single side
// is never a tie.
func Tie(members []planner.Member) bool {
	counts := map[string]int{}
	total := 0
	for _, m := range members {
		if !m.Learner {
			counts[m.Side]++
			total++
		}
	}
	if len(counts) < 2 {
		return false
	}
	for _, n := range counts {
		if 2*n > total {
			return false
		}
	}
	return true
}

// LearnerProgress is what a caller remembers about one learner across
// rounds (the controller keeps it in status.membership.learners, so that it
// survives a restart).
type LearnerProgress struct {
	// ID is the learner's hex member ID.
	ID string
	// Name is its name; empty while it has not started.
	Name string
	// FirstSeen is when the learner was first observed.
	FirstSeen time.Time
	// RaftIndex is the highest raft index it was seen at.
	RaftIndex uint64
	// LastAdvance is when it last made progress: its index grew, or it was
	// caught up.
	LastAdvance time.Time
}

// Progress tracks the learners of one cluster across rounds.
type Progress struct {
	learners map[string]LearnerProgress
}

// NewProgress starts from what an earlier caller remembered.
func NewProgress(known []LearnerProgress) *Progress {
	p := &Progress{learners: map[string]LearnerProgress{}}
	for _, l := range known {
		p.learners[strings.ToLower(l.ID)] = l
	}
	return p
}

// Observe records the observed learners and forgets members that are no
// longer learners.
func (p *Progress) Observe(obs *Observation, maxLag uint64) {
	seen := map[string]bool{}
	for _, m := range obs.List.Members {
		if !m.IsLearner {
			continue
		}
		id := strings.ToLower(m.ID)
		seen[id] = true
		l, ok := p.learners[id]
		if !ok {
			l = LearnerProgress{ID: id, FirstSeen: obs.At, LastAdvance: obs.At}
		}
		if m.Name != "" {
			l.Name = m.Name
		}
		caughtUp := m.Healthy && m.BehindLeader <= maxLag
		if m.Healthy && (m.RaftIndex > l.RaftIndex || caughtUp) {
			l.LastAdvance = obs.At
		}
		if m.RaftIndex > l.RaftIndex {
			l.RaftIndex = m.RaftIndex
		}
		p.learners[id] = l
	}
	for id := range p.learners {
		if !seen[id] {
			delete(p.learners, id)
		}
	}
}

// NoProgressFor is how long the learner has made no progress at now.
func (p *Progress) NoProgressFor(id string, now time.Time) time.Duration {
	l, ok := p.learners[strings.ToLower(id)]
	if !ok {
		return 0
	}
	return max(now.Sub(l.LastAdvance), 0)
}

// Learner returns what is known about one learner.
func (p *Progress) Learner(id string) (LearnerProgress, bool) {
	l, ok := p.learners[strings.ToLower(id)]
	return l, ok
}

// Learners lists the tracked learners, by ID.
func (p *Progress) Learners() []LearnerProgress {
	out := make([]LearnerProgress, 0, len(p.learners))
	for _, l := range p.learners {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// stepTarget names the member a step acts on, even before it has a name.
func stepTarget(s planner.Step) string {
	switch {
	case s.Member != "" && s.ID != "":
		return fmt.Sprintf("%s (%s)", s.Member, s.ID)
	case s.Member != "":
		return s.Member
	default:
		return s.ID
	}
}

// sameStep reports whether two steps do the same thing to the same member.
func sameStep(a, b planner.Step) bool {
	if a.Kind != b.Kind {
		return false
	}
	if a.ID != "" && b.ID != "" {
		return strings.EqualFold(a.ID, b.ID)
	}
	return a.Member == b.Member
}
