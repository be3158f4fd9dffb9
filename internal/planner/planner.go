// Package planner decides the one next membership change that moves an etcd
// cluster toward a desired membership without losing quorum or a write.
//
// Next is a pure function: the caller observes the cluster, asks Next, executes
// the step, observes again and asks again. Nothing is remembered between calls,
// so a caller that crashes in the middle of a step simply decides anew.
package planner

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Member is one etcd member as the caller observed it.
type Member struct {
	// ID is etcd's member ID, as the caller prints it; steps carry it back.
	ID string
	// Name is etcd's member name; empty for a learner that has not started
	// yet. Such a learner is matched to its Want by peer URL; a caller that
	// recognises another unstarted member may fill in its Name.
	Name     string
	PeerURLs []string
	// Side is the group the member belongs to: "local"/"external" for the
	// controller, a host group for standalone rebalancing. For a member in
	// Desired.Add, its Want's Side counts.
	Side string
	// Learner and Leader are the member's raft roles.
	Learner, Leader bool
	// Healthy means the member answered the latest status poll.
	Healthy bool
	// Problem is why the latest poll failed (an etcd alarm such as NOSPACE,
	// "no leader", a timeout), as the caller knows it; it only words a wait.
	Problem string
	// CaughtUp means a learner is close enough to the leader to be promoted.
	CaughtUp bool
	// HealthyFor is how long the member has been healthy without a break;
	// compared with Policy.MinHealthyFor where a removal needs it counted.
	HealthyFor time.Duration
	// ConnectedFor is how long the raft transport of the member that
	// takes the next change has had the member connected without a break;
	// compared with Policy.MinHealthyFor like HealthyFor, whichever is
	// longer. etcd's strict reconfiguration check counts exactly this, and
	// a learner has it before it serves clients. 0 when unknown.
	ConnectedFor time.Duration
	// Unstarted means etcd knows no client URL of the member: it has not
	// published itself yet (its name comes with the publish too, though
	// the caller may have filled it in), so it cannot answer a poll
	// (Healthy is false), while its raft may be connected and caught up.
	// A learner after a snapshot stays so until etcd retries its publish.
	Unstarted bool
	// Unanswered means the latest poll got no answer at all (a dial error,
	// a timeout), as opposed to an answer with errors (an alarm): it says
	// nothing of the member's raft, which ConnectedFor may show running.
	Unanswered bool
	// Replicating means the leader's raft sends the member the log entry
	// by entry, its log close to the leader's, and the leader's transport
	// has it connected: the leader's word that the member's raft runs and
	// votes, whether or not it serves clients. Known only when the caller
	// observed through the leader's sidecar; ConnectedFor is then the
	// leader's view.
	Replicating bool
	// BehindAtLeader means the leader's raft has the learner's log below
	// 90 % of its own, so etcd refuses its promotion: the leader's word,
	// known like Replicating only when the caller observed through the
	// leader's sidecar; false otherwise.
	BehindAtLeader bool
	// ConfiguredFor is, for a learner whose raft is not connected yet, how
	// long its etcd has run with the configuration it joins with (its pod's
	// sidecar served it); compared with Policy.LearnerStagger (rule 2). 0
	// when unknown.
	ConfiguredFor time.Duration
	// NoProgressFor is, for a learner, how long its raft index has not advanced
	// (for an unstarted learner: how long ago it was added); 0 while advancing.
	NoProgressFor time.Duration
	// DownFor is how long the caller has seen the member unhealthy without a
	// break; compared with Policy.DownVoterGrace. 0 when it answered the
	// latest poll, or when the caller does not know since when (a restarted
	// controller): the grace then runs from the caller's first sight.
	DownFor time.Duration
}

// Observed is the membership as etcd reports it, with health per member.
type Observed struct {
	Members []Member
}

// Want is a member that the caller owns and wants as a voter.
type Want struct {
	Name     string
	PeerURLs []string
	Side     string
	// PodNotWaiting, when set, says why the member's pod cannot start it
	// yet (its pod does not answer: not created, not scheduled, its
	// containers starting). A caller whose members start only once admitted
	// sets it; such a member is not added until its pod waits for it (rule
	// 2), and a member whose pod waits is added before it.
	PodNotWaiting string
}

// Desired is the membership the caller wants, split by ownership.
type Desired struct {
	// Add are the members this caller owns and wants as voters; it adds the
	// absent ones.
	Add []Want
	// Learners are members this caller owns and wants joined as learners
	// only: it adds the absent ones once every member of Add is in (and
	// no voter departs), never promotes them, and counts the target
	// reached while they are learners, or absent because the learners
	// already fill Policy.MaxLearners. A caller raises them to Add to let
	// them vote, and they are promoted at once if ready: they have caught
	// up beforehand. etcd cannot turn a voter back into a learner, so a
	// voter listed here is refused.
	Learners []Want
	// Keep are names that must stay but are not the caller's to add or remove
	// (external members under the Keep policy).
	Keep []string
	// Remove are names the caller may remove: its departing members and the
	// external members its policy retires.
	Remove []string
	// Retired are names removed before that must never be added again
	// (ownership handed over to another controller).
	Retired []string
}

// Policy holds the timings and limits Next works with. A zero field takes the
// value DefaultPolicy gives it.
type Policy struct {
	// MinHealthyFor is how long etcd's strict reconfiguration check needs
	// a member connected (or healthy) before it counts it for a removal
	// (etcd's HealthInterval, 5 s): the voters that stay before a removal,
	// and a learner whose promotion makes a tie whose removal needs it
	// counted. No other promotion waits for it: etcd checks only the
	// learner's log there.
	MinHealthyFor time.Duration
	// LearnerProgressTimeout is how long a learner may fail to advance before
	// it is removed again. It must cover a snapshot transfer, during which the
	// learner's index does not move.
	LearnerProgressTimeout time.Duration
	// MaxLearners is etcd's limit on learners (--max-learners).
	MaxLearners int
	// LearnerStagger is how long a joining learner's etcd runs with its
	// configuration before the membership may change again (rule 2): its
	// first request asks a voter for the cluster's members, one round trip
	// between the sites with a TLS handshake, and compares them with its
	// initial cluster; a change before that fails its start.
	LearnerStagger time.Duration
	// DownVoterGrace is how long a departing voter that is down is waited
	// for when its removal would leave fewer voters than the target and no
	// learner can be promoted first: a pod being recreated comes back within
	// it, and its removal would run the cluster on fewer voters until the
	// next promotion. A member down for longer is taken for gone and removed.
	DownVoterGrace time.Duration
}

// DefaultPolicy returns etcd's own figures: strict reconfiguration counts a
// member after 5 s connected, and etcd allows one learner.
func DefaultPolicy() Policy {
	return Policy{MinHealthyFor: 5 * time.Second, LearnerProgressTimeout: 5 * time.Minute, MaxLearners: 1, DownVoterGrace: DefaultDownVoterGrace, LearnerStagger: DefaultLearnerStagger}
}

// DefaultLearnerStagger covers the joining etcd's first request on a busy
// machine: a TCP and a TLS handshake and the request itself, three round
// trips of a link between seeds of up to a few hundred milliseconds.
const DefaultLearnerStagger = 1500 * time.Millisecond

// DefaultDownVoterGrace covers a pod's recreation on a busy node: etcd's
// preStop wait and stop, the new pod's scheduling, backup-restore's check
// of the data directory, and etcd's start.
const DefaultDownVoterGrace = time.Minute

func (p Policy) withDefaults() Policy {
	d := DefaultPolicy()
	if p.MinHealthyFor <= 0 {
		p.MinHealthyFor = d.MinHealthyFor
	}
	if p.LearnerProgressTimeout <= 0 {
		p.LearnerProgressTimeout = d.LearnerProgressTimeout
	}
	if p.MaxLearners <= 0 {
		p.MaxLearners = d.MaxLearners
	}
	if p.DownVoterGrace <= 0 {
		p.DownVoterGrace = d.DownVoterGrace
	}
	if p.LearnerStagger <= 0 {
		p.LearnerStagger = d.LearnerStagger
	}
	return p
}

// StepKind says what a Step asks the caller to do.
type StepKind string

// The step kinds. Wait and Done change nothing.
const (
	AddLearner StepKind = "AddLearner"
	Promote    StepKind = "Promote"
	MoveLeader StepKind = "MoveLeader"
	Remove     StepKind = "Remove"
	Wait       StepKind = "Wait"
	Done       StepKind = "Done"
)

// The rules that decide a step, as they appear in Step.Rule; docs/concepts.md
// states each once, with the test that checks it.
const (
	RuleHealthyCluster = "HealthyClusterFirst" // 1
	RuleOneLearner     = "OneLearnerAtATime"   // 2
	RuleReadyLearner   = "PromoteReadyLearner" // 3
	RuleQuorum         = "KeepHealthyQuorum"   // 4
	RuleLeaderLast     = "NeverRemoveLeader"   // 5
	RuleInterleave     = "Interleave"          // 6
	RuleUnmanaged      = "NeverTouchUnmanaged" // 7
	RuleStuckLearner   = "RemoveStuckLearner"  // 8
	RuleOwnership      = "Ownership"           // 9
	RuleTargetSize     = "NeverBelowTarget"    // 10
	RuleValidTarget    = "ValidTarget"         // the desired membership itself is wrong
	RuleTargetReached  = "TargetReached"
)

// Step is the one thing to do next.
type Step struct {
	Kind StepKind
	// Member is the name of the member the step acts on; for MoveLeader the
	// member that becomes leader. Empty for Wait and Done.
	Member string
	// ID is the member's etcd ID when it is a member already (empty for
	// AddLearner), so an unstarted learner without a name can be addressed.
	ID       string
	PeerURLs []string
	// Reason explains the step to a person. A Wait reason starts with a
	// CamelCase word (WaitingForLearner, WaitingForHealthyCluster, ...) that
	// can serve as a condition reason.
	Reason string
	// Rule is the rule that decided the step (one of the Rule constants).
	Rule string
	// ReadyIn is, for a Wait that ends by itself once members have been
	// connected or healthy for Policy.MinHealthyFor, how much of that is
	// left as observed; 0 when the wait's end is not known. A caller polls
	// again then instead of at its usual interval.
	ReadyIn time.Duration
}

// String prints the step on one line, for logs and the rebalance command.
func (s Step) String() string {
	if s.Member == "" {
		return fmt.Sprintf("%s [%s]: %s", s.Kind, s.Rule, s.Reason)
	}
	return fmt.Sprintf("%s %s [%s]: %s", s.Kind, s.Member, s.Rule, s.Reason)
}

// Next returns the single next step from obs toward want. It decides in this
// order, each rule (docs/concepts.md) enforced where it decides:
//
//   - a desired membership that contradicts itself: Wait (rule 9 for retired names);
//   - the target reached: Done;
//   - no leader, or a voter that stays is down: Wait; a departing voter that is
//     down: Remove, if a healthy quorum stays (rules 1, 4);
//   - a learner we no longer want: Remove (rule 9);
//   - the goal side holds the majority and the leader sits on the other
//     (departing, or kept there for now): MoveLeader to the goal side
//     (rule 6);
//   - a learner we want as a learner only: stuck, Remove (rule 8); it is
//     never promoted;
//   - our learner: stuck, Remove (rule 8); not ready, Wait (rule 3); ready,
//     Promote (rule 3), after MoveLeader if the tie it makes could end only
//     with the leader's removal (rule 6); with Policy.MaxLearners above 1,
//     first the further learners the target needs, and each promotion
//     interleaved with the removals (rules 2, 6);
//   - otherwise one add or one removal, interleaved (rule 6), keeping quorum
//     (rule 4), leader last (rule 5), at most MaxLearners learners (rule 2),
//     and never touching an unmanaged member (rule 7); the members wanted
//     as learners only come last, once no voter is to come or go.
//
// A leader transfer waits while a learner's publish is pending (rule 6).
func Next(obs Observed, want Desired, p Policy) Step {
	p = p.withDefaults()
	if s, bad := checkDesired(want); bad {
		return s
	}
	v, s, bad := newView(obs, want)
	if bad {
		return s
	}
	return v.holdTransfer(v.next(obs, p))
}

// next is Next on the view v of obs.
func (v *view) next(obs Observed, p Policy) Step {
	if v.reached(p) && !v.leaderAwayFromGoal() {
		return Step{Kind: Done, Rule: RuleTargetReached, Reason: "target reached: " + Describe(obs.Members) + v.unmanagedNote() + v.slotNote(p)}
	}
	gate, blocked := v.healthGate(p)
	if blocked && !v.learnerMayJoin(p) {
		return gate
	}
	if next := v.afterGate(p); !blocked || next.Kind == AddLearner {
		return next
	}
	return gate
}

// holdTransfer turns a leader transfer into a wait while a learner's
// publish is pending (rule 6): a learner that caught up by snapshot loses
// its first publish while the snapshot applies, and etcd retries it after
// its request timeout (about 9 s). The publish is a proposal the learner
// forwards to the leader, and a leader drops forwarded proposals while it
// transfers leadership: a transfer then would cost the learner another
// request timeout before it serves clients. Pending means its raft is
// connected and etcd knows no client URL of it yet (its name is empty in
// etcd's member list); a learner not connected has not started its etcd,
// and one connected for publishOverdue or longer is not about to publish,
// so neither holds the transfer. Nor does anything hold the transfer that
// ends a tie: the tie costs the whole cluster, the publish one learner.
func (v *view) holdTransfer(s Step) Step {
	if s.Kind != MoveLeader || v.goal != "" && holder(v.voterCounts()) == "" {
		return s
	}
	for _, l := range v.learners {
		if l.Unstarted && !l.Healthy && l.ConnectedFor > 0 && l.ConnectedFor < publishOverdue {
			return waitStep(s.Rule, "WaitingForMemberStart: leadership goes to %s once learner %s has published itself (connected for %s; a transfer drops the publish it forwards to the leader)",
				s.Member, l.label(), l.ConnectedFor)
		}
	}
	return s
}

// afterGate plans the step once rule 1's health gate lets changes through.
func (v *view) afterGate(p Policy) Step {
	for _, l := range v.learners {
		if l.role == departing {
			// Rule 9: a learner we own but no longer want holds the only learner
			// slot; it has no vote, so removing it never risks quorum.
			return l.step(Remove, RuleOwnership, fmt.Sprintf("learner %s is not wanted any more", l.label()))
		}
	}
	if s, move := v.leaderToMajority(); move {
		return s
	}
	if s, ok := v.learnerStep(p); ok {
		return s
	}
	return v.change(p)
}

// checkDesired refuses a desired membership that contradicts itself, before
// anything is changed on its account.
func checkDesired(want Desired) (Step, bool) {
	seen := map[string]string{}
	note := func(name, list string) (Step, bool) {
		if name == "" {
			return waitStep(RuleValidTarget, "InvalidTarget: an empty name in %s", list), true
		}
		if prev, dup := seen[name]; dup {
			return waitStep(RuleValidTarget, "InvalidTarget: %s is listed in both %s and %s", name, prev, list), true
		}
		seen[name] = list
		return Step{}, false
	}
	for _, w := range want.Add {
		if s, bad := note(w.Name, "Add"); bad {
			return s, true
		}
		if len(w.PeerURLs) == 0 {
			return waitStep(RuleValidTarget, "InvalidTarget: %s has no peer URLs", w.Name), true
		}
	}
	for _, w := range want.Learners {
		if s, bad := note(w.Name, "Learners"); bad {
			return s, true
		}
		if len(w.PeerURLs) == 0 {
			return waitStep(RuleValidTarget, "InvalidTarget: %s has no peer URLs", w.Name), true
		}
	}
	for _, n := range want.Keep {
		if s, bad := note(n, "Keep"); bad {
			return s, true
		}
	}
	for _, n := range want.Remove {
		if s, bad := note(n, "Remove"); bad {
			return s, true
		}
	}
	for _, n := range want.Retired {
		// Rule 9: a retired name belongs to whoever retired it; re-adding it would
		// undo a hand-over, so the whole target is refused rather than half applied.
		if seen[n] == "Add" || seen[n] == "Learners" {
			return waitStep(RuleOwnership, "RetiredMember: %s was retired and must never be added again", n), true
		}
	}
	return Step{}, false
}

// healthGate holds every change until the cluster has a leader and every voter
// answers, except the removal of a departing voter that is down.
func (v *view) healthGate(p Policy) (Step, bool) {
	// Rule 1: without a leader nothing commits, and a change made while a voter
	// is down spends the failure the cluster could otherwise survive.
	if v.leader == nil {
		return waitStep(RuleHealthyCluster, "WaitingForHealthyCluster: no leader"), true
	}
	var down *member
	for _, m := range v.voters {
		if !holdsChanges(m, p) {
			continue
		}
		if m.role != departing || m.Leader {
			if m.Unstarted && m.ConnectedFor > 0 {
				// Its raft runs: the publish follows within seconds.
				return waitStep(RuleHealthyCluster, "%s: voter %s%s does not serve clients yet (etcd has not applied its publish; connected for %s)", startWord(m), m.label(), m.roleNote(), m.ConnectedFor), true
			}
			if m.Unstarted {
				return waitStep(RuleHealthyCluster, "WaitingForHealthyCluster: voter %s%s does not serve clients yet, and no member has it connected", m.label(), m.roleNote()), true
			}
			if m.Problem != "" {
				return waitStep(RuleHealthyCluster, "WaitingForHealthyCluster: voter %s%s is unhealthy: %s", m.label(), m.roleNote(), m.Problem), true
			}
			return waitStep(RuleHealthyCluster, "WaitingForHealthyCluster: voter %s is not answering%s", m.label(), m.roleNote()), true
		}
		if m.ConnectedFor > 0 {
			// Its raft is connected to the member taking the change: it
			// missed a poll (a busy node answers a status call late), it is
			// not down, and it still votes. Removing it as down would take
			// the voters below what the plan counts on (a rebalance went
			// from three voters to one this way, ahead of the promotion
			// that should have come first).
			why := "is not answering"
			if m.Problem != "" {
				why = "did not answer: " + m.Problem
			}
			return waitStep(RuleHealthyCluster, "WaitingForHealthyCluster: departing voter %s %s, yet its raft is connected (for %s), so it is not removed as down", m.label(), why, m.ConnectedFor), true
		}
		if down == nil {
			down = m
		}
	}
	if down == nil {
		return Step{}, false
	}
	// Rule 1's exception: a departing voter that is down only weighs on the
	// quorum; removing it heals the cluster, provided the rest keeps a healthy quorum.
	// A ready learner of ours that the removal would otherwise leave short
	// of the target's voters is promoted first: the voter may only be a pod
	// being recreated, and removing it first would run the cluster on
	// fewer voters than the target until the promotion.
	if len(v.voters)-1 < v.size {
		if s, ok := v.promoteBeforeHeal(p); ok {
			return s, true
		}
	}
	s := v.removeVoter(down, p, RuleHealthyCluster, fmt.Sprintf("departing voter %s is down; removing it heals the cluster", down.label()))
	if s.Kind == Remove && len(v.voters)-1 < v.size && down.DownFor < p.DownVoterGrace {
		// Nothing can be promoted first: a pod being recreated comes back
		// as the voter it was, and the cluster keeps the votes the target
		// counts on; one that stays down is removed once the grace ran out.
		s = waitStep(RuleHealthyCluster, "WaitingForDownVoter: departing voter %s has been down for %s of %s; removing it now would leave %d voters, fewer than the target's %d, and no learner of ours is ready to be promoted first (its pod may be starting again)",
			down.label(), down.DownFor, p.DownVoterGrace, len(v.voters)-1, v.size)
		s.ReadyIn = p.DownVoterGrace - down.DownFor
	}
	return s, true
}

// promoteBeforeHeal is the promotion of a ready learner of ours, when one
// can be promoted at once, for the health gate's exception.
func (v *view) promoteBeforeHeal(p Policy) (Step, bool) {
	for _, l := range v.learners {
		if l.role != owned || !l.Healthy {
			// One that does not answer polls yet is promoted on the
			// leader's word alone; with a voter down that is one unknown
			// too many.
			continue
		}
		if _, ready := v.learnerState(l, p); !ready {
			continue
		}
		before := v.voterCounts()
		after := maps.Clone(before)
		after[l.Side]++
		if holder(after) != holder(before) {
			// Rule 6: the majority changes sides through a removal only.
			continue
		}
		if s := v.promote(l, p); s.Kind == Promote {
			s.Rule, s.Reason = RuleHealthyCluster, s.Reason+"; a departing voter is down, and removing it first would leave fewer voters than the target"
			return s, true
		}
	}
	return Step{}, false
}

// learnerMayJoin tells whether a learner may be added although the health
// gate holds every other change: there is a leader, and each voter that
// holds the gate stays and has its raft connected to the member taking the
// change right now, only for less than MinHealthyFor or without serving
// clients yet. A learner has no vote, so its add spends none of the
// failures the cluster could survive, and etcd's strict reconfiguration
// check does not weigh it. The case it is for: a member applying a snapshot
// drops and re-opens its raft streams, so the voter promoted right after
// its snapshot join counts as connected from that moment on, and its
// client port opens after the promotion; the next learner of a move would
// otherwise wait those 5 s for nothing (measured at 180 ms RTT).
func (v *view) learnerMayJoin(p Policy) bool {
	if v.leader == nil {
		return false
	}
	for _, m := range v.voters {
		if !holdsChanges(m, p) {
			continue
		}
		if m.role == departing || m.ConnectedFor <= 0 || !(m.Unstarted || m.Unanswered) {
			return false
		}
	}
	return true
}

// holdsChanges tells whether voter m holds rule 1's health gate: it is
// neither healthy nor a voter whose raft has run, connected, for
// MinHealthyFor without answering polls yet.
func holdsChanges(m *member, p Policy) bool {
	return !m.Healthy && !connectedUnstarted(m, p) && !connectedUnanswered(m, p) && !replicatingStayer(m)
}

// replicatingStayer tells whether m, a voter that stays and serves no
// client yet (it has not published itself, or its poll got no answer),
// is one the leader's raft replicates to: its raft runs and votes, which
// is what rule 1 asks of a voter, without waiting MinHealthyFor for a
// transport's word. A voter promoted right after its snapshot join is the
// case: etcd publishes it only when it retries the publish the snapshot
// swallowed, seconds after it votes. One that answered with errors (an
// alarm) still holds every change, and so does a departing one, whose
// removal needs its sidecar to drain its clients. It counts for no
// removal's quorum (rule 4): the sidecar that takes a removal is a
// follower's, with no word from the leader, and counts voters that answer.
func replicatingStayer(m *member) bool {
	return !m.Healthy && m.Replicating && (m.Unstarted || m.Unanswered) && m.role != departing
}

// connectedUnstarted tells whether m has not published itself yet (it
// cannot answer a poll) but has been connected to the transport of the
// member taking the change for MinHealthyFor: its raft runs and votes, and
// etcd promoted it only with its log caught up. Such a voter holds no
// change (rule 1), yet counts for no removal's quorum (rule 4), since etcd
// counts only started members there.
func connectedUnstarted(m *member, p Policy) bool {
	return !m.Healthy && m.Unstarted && m.ConnectedFor >= p.MinHealthyFor
}

// connectedUnanswered tells whether m, a voter that stays, got no answer
// to the latest poll (its client port does not serve yet, or does not
// resolve from the sidecar that polled) while the transport of the member
// taking the change has had it connected for MinHealthyFor: its raft runs
// and votes, so, like an unstarted one, it holds no change (rule 1), yet
// counts for no removal's quorum (rule 4) nor as a leader's successor. A
// voter that answered with errors (an alarm such as NOSPACE) still holds
// every change, and so does a departing one, whose removal would need its
// sidecar to drain its clients.
func connectedUnanswered(m *member, p Policy) bool {
	return !m.Healthy && m.Unanswered && m.role != departing && m.ConnectedFor >= p.MinHealthyFor
}

// publishOverdue is how long a voter may run without serving clients
// before its wait is a problem to report rather than a start to wait for:
// etcd publishes a member within its request timeout after a snapshot
// (5 s plus two election timeouts), retrying until it has.
const publishOverdue = time.Minute

// startWord is the wait word for a change held by m, a voter that does not
// serve clients yet: its start while that is recent, its health after.
func startWord(m *member) string {
	if m.ConnectedFor >= publishOverdue {
		return "WaitingForHealthyCluster"
	}
	return "WaitingForMemberStart"
}

// learnerStep promotes, waits for or removes the learners we own.
func (v *view) learnerStep(p Policy) (Step, bool) {
	var ours []*member
	for _, l := range v.learners {
		if l.role == learnerOnly && stuck(l, p) {
			return removeStuck(l, p), true
		}
		if l.role == owned {
			ours = append(ours, l)
		}
	}
	if len(ours) == 0 {
		return Step{}, false
	}
	if p.MaxLearners > 1 {
		return v.parallelLearners(ours, p), true
	}
	// Rule 1: a learner of ours is an add still in flight; nothing else
	// changes until it is ready.
	l := ours[0]
	if s, ready := v.learnerState(l, p); !ready {
		return s, true
	}
	if rm := v.nextRemoval(); rm != nil && v.removeFirst(rm, true, 1) {
		// Rule 6, as in parallelLearners: a ready learner that was added
		// ahead of the removals (a move's destination warmed its members
		// as learners) is a voter still to come; the removal it would
		// otherwise overtake goes first, so the voters go n, n+1, n.
		return v.removeVoter(rm, p, RuleInterleave, fmt.Sprintf("%s is departing", rm.label())), true
	}
	return v.promote(l, p), true
}

// parallelLearners decides while several learners may catch up at once
// (etcd's --max-learners above 1). The learners the target still needs are
// added first, so that they catch up side by side instead of one after
// another; each is promoted once ready, and the promotions interleave with
// the removals exactly as one learner's would (rule 6): a learner in flight
// counts as a voter still to come.
func (v *view) parallelLearners(ours []*member, p Policy) Step {
	inTie := v.goal != "" && holder(v.voterCounts()) == ""
	var held Step
	w, onlyLearner := v.nextAdd(), false
	if w == nil {
		w = v.nextLearnerOnly()
		onlyLearner = w != nil
	}
	if w != nil && len(v.learners) < p.MaxLearners && !inTie {
		// Rule 6: in a tie only the removal that ends it comes next. A
		// conflicting peer URL holds only this add; the learners under way
		// go on.
		if l := starting(v.ownLearners(), p); l != nil {
			// Rule 2: a joining etcd first asks a member for the
			// cluster's members and refuses to start unless they are
			// exactly its initial cluster, so the next add waits until
			// it has asked. It then asks every member it knows for its
			// version before it starts its raft, and a member that is
			// starting too accepts the connection but answers only once
			// it has started: two members starting at once that know
			// each other each wait out the other's request timeout. One
			// added after the other asked is unknown to it, and waits
			// only for the other's start.
			held = startingWait(l, w, p)
			if l.NoProgressFor < startingHold && !onlyLearner {
				// The learners the target needs join first, so that they
				// catch up side by side; a promotion waits the moment
				// this takes, unless the start is overdue. A learner
				// that is to stay one holds no promotion.
				return held
			}
		} else if l := receiving(v.ownLearners()); l != nil {
			// Rule 2: the leader sends a joining learner its snapshot
			// over the same link as the next learner's; side by side
			// they share it, and each takes as long as all of them
			// together. One at a time, the first is ready for its
			// promotion (and the removals behind it) after its own
			// snapshot. The learners already in go on meanwhile.
			held = receivingWait(l, w)
		} else if s := v.addLearner(w, p); s.Kind == AddLearner {
			return s
		} else if w.PodNotWaiting != "" {
			held = s
		}
	}
	var ready *member
	var first Step
	for i, l := range ours {
		s, ok := v.learnerState(l, p)
		if s.Kind == Remove {
			return s // rule 8: a stuck learner holds a slot for good
		}
		if ok && (ready == nil || readiness(l, p) > readiness(ready, p)) {
			ready = l
		}
		if i == 0 {
			first = s
		}
	}
	// Rule 6: in a tie the removal that ends it comes next, whether or not
	// another learner is ready: waiting for one would hold the tie for as
	// long as that learner takes. Outside a tie, a removal the learners in
	// flight do not make up for yet (departing voters outnumber them) needs
	// none of them ready either: the voters go n+1 to n (waiting for a
	// learner's snapshot join held it for 12 s at 180 ms RTT). Not while a
	// learner starts, when none is ready: its etcd compares the membership
	// it was admitted with against the cluster's, and a removal in between
	// fails that start.
	waiting := ready == nil && !inTie
	if rm := v.nextRemoval(); rm != nil && !(waiting && starting(ours, p) != nil) && v.removeFirst(rm, true, len(ours)) {
		return v.removeVoter(rm, p, RuleInterleave, fmt.Sprintf("%s is departing", rm.label()))
	}
	if waiting && held.Kind == Wait {
		return held
	}
	if ready == nil {
		return first
	}
	return v.promote(ready, p)
}

// startingHold is how long a learner's start holds the promotions of the
// learners already running: a member's etcd starts within seconds of its
// add (its pod, its admission, its bootstrap); one that takes longer is not
// about to, and the others go on without waiting for it.
const startingHold = 30 * time.Second

// starting is the first learner whose etcd may not have asked the cluster
// for its members yet, as far as the caller saw: it serves no clients, no
// transport has it connected, and its etcd has not run LearnerStagger with
// its configuration (or the caller does not know that it has).
func starting(learners []*member, p Policy) *member {
	for _, l := range learners {
		if l.Unstarted && !l.Healthy && l.ConnectedFor == 0 && l.ConfiguredFor < p.LearnerStagger {
			return l
		}
	}
	return nil
}

// receiving is the first learner whose snapshot (or the log after it) the
// leader is sending, in the leader's word: its transport has the learner
// connected, and its raft has the learner's log below 90 % of its own.
// Without the leader's word (an observation through another sidecar) none
// is.
func receiving(learners []*member) *member {
	for _, l := range learners {
		if l.BehindAtLeader && l.ConnectedFor > 0 {
			return l
		}
	}
	return nil
}

// receivingWait is the wait of w's add while the leader sends learner l
// its log (rule 2).
func receivingWait(l *member, w *Want) Step {
	return waitStep(RuleOneLearner, "WaitingForLearner: the leader is sending %s its log (below 90 %% of its own); %s joins once it has caught up, so that their snapshots do not share the link", l.label(), w.Name)
}

// learnerState tells whether our learner l can be promoted; when it
// cannot, the step is its wait or, for a stuck learner, its removal.
func (v *view) learnerState(l *member, p Policy) (Step, bool) {
	switch {
	case stuck(l, p):
		return removeStuck(l, p), false
	case l.BehindAtLeader:
		// Rule 3: etcd would refuse the promotion, and the caller would
		// wait out the refusal before its next step (the next learner's
		// add among them). The leader's word counts over the learner's
		// own answer: the leader's acknowledgements of its log cross the
		// sites and come later than the learner's own raft index.
		return waitStep(RuleReadyLearner, "WaitingForLearner: the leader has %s's log below 90 %% of its own, where etcd refuses a promotion (its snapshot or the entries after it are on their way)", l.label()), false
	case !l.Healthy && l.ConnectedFor > 0:
		// Rule 3: a learner that does not answer polls yet (it has not
		// published itself, or its client port is not reachable yet) can
		// still be judged by the leader: etcd refuses the promotion of a
		// learner whose log is behind (ErrLearnerNotReady), and the
		// transport shows it connected. Waiting for the publish instead
		// costs etcd's request timeout after a snapshot.
	case !l.Healthy && l.Unstarted:
		return waitStep(RuleReadyLearner, "WaitingForLearner: %s does not serve clients yet, and its raft is not connected", l.label()), false
	case !l.Healthy:
		return waitStep(RuleReadyLearner, "WaitingForLearner: %s is not answering yet, and its raft is not connected", l.label()), false
	case !l.CaughtUp:
		return waitStep(RuleReadyLearner, "WaitingForLearner: %s is catching up with the leader", l.label()), false
	case v.tieNeedsIt(l, p):
		// Rule 6 before rule 3: the removal that ends the tie would wait
		// for l to be counted, and the tie with it; before the promotion
		// the same wait costs no tie.
		return readyIn(waitStep(RuleReadyLearner, "WaitingForLearner: promoting %s makes a tie, and the removal that ends it needs %s counted by etcd's strict reconfiguration check: healthy or connected for %s of %s",
			l.label(), l.label(), settledFor(l), p.MinHealthyFor), settledFor(l), p), false
	}
	// Rule 3: etcd puts no time on a promotion, only the learner's log; a
	// removal that needs the new voter counted waits for it (rule 4).
	return Step{}, true
}

// early tells whether the ready learner l is promoted before etcd's strict
// reconfiguration check counts it.
func early(l *member, p Policy) bool { return l.Healthy && settledFor(l) < p.MinHealthyFor }

// readiness ranks the ready learner l for promotion. One that answers
// polls goes before one that does not yet: the removals after it, the one
// that ends a tie above all, count only voters that answer, and a
// promotion into a tie waits for a learner that does not. Among those that
// answer, one etcd's strict reconfiguration check counts already goes
// before one it does not yet: the removals after it may need it counted.
func readiness(l *member, p Policy) int {
	switch {
	case !l.Healthy:
		return 0
	case early(l, p):
		return 1
	}
	return 2
}

// tieNeedsIt tells whether learner l, caught up but not yet counted by
// etcd's strict reconfiguration check (healthy or connected for less than
// MinHealthyFor), is to wait before its promotion: the promotion makes a
// tie, and the removal that ends it (sent in the same call) cannot follow
// at once: the voters left would make no quorum that etcd counts without
// l, or another rule holds that removal, which the 5 s may let pass. Any
// other promotion goes at once: etcd checks no connection
// time for a promotion, only the learner's log and the started members,
// and a removal after it that needs l counted waits for it (rule 4) with
// one more voter in the cluster, not in a tie. The removal is planned as
// tieEndsAtOnce plans it: on the membership after the promotion, with
// leadership where leaderBeforeTie would move it.
func (v *view) tieNeedsIt(l *member, p Policy) bool {
	if settledFor(l) >= p.MinHealthyFor {
		return false
	}
	after := v.voterCounts()
	after[l.Side]++
	return v.makesTie(after) && !v.tieEndsAtOnce(l, after, p)
}

// stuck tells whether learner l has not caught up and made no progress
// for the policy's limit.
func stuck(l *member, p Policy) bool {
	return !l.CaughtUp && l.NoProgressFor >= p.LearnerProgressTimeout
}

// removeStuck removes the stuck learner l. Rule 8: a learner that never
// catches up holds a learner slot for good; remove it and let the caller
// report it and try again.
func removeStuck(l *member, p Policy) Step {
	return l.step(Remove, RuleStuckLearner, fmt.Sprintf("learner %s made no progress for %s (limit %s)", l.label(), l.NoProgressFor, p.LearnerProgressTimeout))
}

// startingWait is the wait of w's add while learner l starts (rule 2).
func startingWait(l *member, w *Want, p Policy) Step {
	if l.ConfiguredFor > 0 {
		s := waitStep(RuleOneLearner, "WaitingForLearner: %s's etcd took its configuration %s ago and asks the cluster for its members; %s joins %s after that take (a change before the ask fails its start)",
			l.label(), l.ConfiguredFor, w.Name, p.LearnerStagger)
		s.ReadyIn = p.LearnerStagger - l.ConfiguredFor
		return s
	}
	return waitStep(RuleOneLearner, "WaitingForLearner: %s has not started its etcd yet; %s joins once it has asked the cluster for its members (a change before the ask fails its start)", l.label(), w.Name)
}

// settledFor is how long etcd's strict reconfiguration check has counted m
// as connected, as far as the caller saw: connected to the transport of
// the member that takes the change, or healthy in the caller's polls.
func settledFor(m *member) time.Duration { return max(m.HealthyFor, m.ConnectedFor) }

// promote promotes the ready learner l once the tie it may make can end
// at once (rule 6).
func (v *view) promote(l *member, p Policy) Step {
	after := v.voterCounts()
	after[l.Side]++
	if s, wait := v.unstartedBeforeTie(after, "promoting "+l.label()); wait {
		return s
	}
	if !l.Healthy && v.goal != "" && holder(after) == "" && !v.tieEndsAtOnce(l, after, p) {
		// Rule 6: a learner that does not serve clients yet is promoted
		// into a tie only when the removal that ends the tie can follow at
		// once; etcd does not count it as started for that removal, so
		// the voters that stay must make the quorum without it.
		return waitStep(RuleInterleave, "WaitingForLearner: promoting %s makes a tie, and the removal that ends it would need %s to serve clients", l.label(), l.label())
	}
	if !l.Healthy && !l.Replicating && v.makesTie(after) {
		// Rule 6: the promotion that makes a tie goes in one call with the
		// removal that ends it, and that removal's member has its clients
		// drained first. etcd refuses the promotion of a learner whose log
		// the leader does not see caught up; each refusal would undo a
		// drain its clients already waited through. A learner that answers
		// no poll is promoted into a tie only on the leader's word that
		// its raft replicates; any other promotion costs nothing when
		// refused and goes on etcd's own check.
		return waitStep(RuleInterleave, "WaitingForLearner: promoting %s makes a tie, whose removal drains a member's clients first; %s answers no poll yet, and the leader does not report its log caught up", l.label(), l.label())
	}
	if s, move := v.leaderBeforeTie(after, nil); move {
		return s
	}
	if !l.Healthy {
		return l.step(Promote, RuleReadyLearner, fmt.Sprintf("learner %s is connected for %s; it does not answer polls yet, and etcd checks that its log is caught up", l.label(), l.ConnectedFor))
	}
	return l.step(Promote, RuleReadyLearner, fmt.Sprintf("learner %s is caught up and healthy or connected for %s", l.label(), settledFor(l)))
}

// makesTie tells whether a change leading to the voter counts after makes
// a tie during a move: a side holds the majority now and none does after.
func (v *view) makesTie(after map[string]int) bool {
	return v.goal != "" && holder(v.voterCounts()) != "" && holder(after) == ""
}

// unstartedBeforeTie holds the change that makes a tie (what) while a
// voter does not serve clients yet (rule 6): the removal that ends the
// tie needs the voters that stay started, and leadership moves after it
// only to a voter that answers; with every voter answering, both follow
// at once, as the tie needs.
func (v *view) unstartedBeforeTie(after map[string]int, what string) (Step, bool) {
	if !v.makesTie(after) {
		return Step{}, false
	}
	for _, m := range v.voters {
		if (m.Unstarted || m.Unanswered) && !m.Healthy {
			return waitStep(RuleInterleave, "%s: %s makes a tie, which waits until voter %s serves clients (connected for %s)", startWord(m), what, m.label(), m.ConnectedFor), true
		}
	}
	return Step{}, false
}

// tieEndsAtOnce tells whether, once l is promoted into a tie, the next
// step is the change that ends it, planned on the membership as it will be
// (leadership moved first when leaderBeforeTie moves it).
func (v *view) tieEndsAtOnce(l *member, after map[string]int, p Policy) bool {
	leader := v.leader
	if s, move := v.leaderBeforeTie(after, nil); move {
		for _, m := range v.members {
			if m.ID == s.ID && m.name == s.Member {
				leader = m
			}
		}
	}
	obs := Observed{Members: make([]Member, 0, len(v.members))}
	for _, m := range v.members {
		pm := m.Member
		pm.Learner = pm.Learner && m != l
		pm.Leader = m == leader
		obs.Members = append(obs.Members, pm)
	}
	return Next(obs, v.want, p).Kind == Remove
}

// change picks the next add or removal. The cluster is healthy and holds no
// learner of ours here.
func (v *view) change(p Policy) Step {
	add, rm := v.nextAdd(), v.nextRemoval()
	if add == nil && rm == nil {
		if w := v.nextLearnerOnly(); w != nil {
			if l := starting(v.ownLearners(), p); l != nil {
				return startingWait(l, w, p) // rule 2, as in parallelLearners
			}
			return v.addLearner(w, p)
		}
		return waitStep(RuleTargetReached, "NothingToDo: no member to add or remove, yet the target is not reached")
	}
	if rm != nil && v.removeFirst(rm, add != nil, 0) {
		return v.removeVoter(rm, p, RuleInterleave, fmt.Sprintf("%s is departing", rm.label()))
	}
	return v.addLearner(add, p)
}

// removeFirst tells whether the departing voter rm goes before the next
// voter comes (adding: a member to add or a ready learner to promote), with
// inFlight learners of ours already added.
func (v *view) removeFirst(rm *member, adding bool, inFlight int) bool {
	// Rule 6: add one target member, then remove one departing member, so the
	// cluster goes n, n+1, n, ... and never n, 2n, n. Learners in flight are
	// voters still to come, like the members not added yet.
	removeNext := !adding || v.departingVoters() > len(v.missing)+inFlight
	if adding && v.goal != "" {
		// Rule 6: a tie (no side holds a majority) stalls writes when the sides
		// are cut apart; keep it to the time of one removal.
		now, after := holder(v.voterCounts()), holder(v.countsWithout(rm))
		switch {
		case now == "" && after == v.goal:
			removeNext = true // in a tie: a removal ends it fastest
		case now != "" && after == "":
			// A tie made by a removal lasts until a new learner has caught up;
			// the tie the next promotion makes ends with a removal.
			removeNext = false
		}
	}
	if removeNext && adding && rm.Leader && v.successor(rm, v.countsWithout(rm)) == nil && v.startingSuccessor(rm) == nil {
		// Rule 5: nobody could take over from the leader yet; a new member
		// will. A voter that stays and is still starting will sooner, and
		// promoting more learners meanwhile would only add voters (n+2,
		// n+3, ...) none of whom serves clients either.
		removeNext = false
	}
	return removeNext
}

// removeVoter removes e once quorum and leadership allow it.
func (v *view) removeVoter(e *member, p Policy, rule, why string) Step {
	after := v.countsWithout(e)
	left, healthy := 0, 0
	var settling []time.Duration // what the healthy voters that stay lack of MinHealthyFor
	for _, m := range v.voters {
		if m != e {
			left++
			switch {
			case m.Healthy && settledFor(m) >= p.MinHealthyFor:
				healthy++
			case m.Healthy:
				settling = append(settling, p.MinHealthyFor-settledFor(m))
			}
		}
	}
	// Rule 4: the voters that stay must still commit on their own; etcd's
	// strict reconfiguration check counts only those connected for 5 s.
	if left == 0 {
		return waitStep(RuleQuorum, "WaitingForQuorum: %s is the last voter", e.label())
	}
	if healthy < quorum(left) {
		s := waitStep(RuleQuorum, "WaitingForQuorum: removing %s would leave %d of %d voters healthy and connected for %s, below a quorum of %d", e.label(), healthy, left, p.MinHealthyFor, quorum(left))
		if need := quorum(left) - healthy; need <= len(settling) {
			// Voters promoted moments ago: the quorum is there once the
			// need-th of them has been connected long enough.
			slices.Sort(settling)
			s.ReadyIn = settling[need-1]
		}
		return s
	}
	if rule != RuleHealthyCluster && len(v.keptAbsent) > 0 && left < v.size {
		// Rule 10: a removal never takes the voters below what the target
		// keeps. An aborted move is a move back: the source's members that
		// were retired come back as voters (their controller adds them)
		// before the destination's leave, so the cluster never drops to N-1.
		// A departing voter that is down is the exception (rule 1): it
		// votes for nothing while it stays.
		return waitStep(RuleTargetSize, "WaitingForKeptMembers: removing %s would leave %d voters, fewer than the %d the target keeps; waiting until %s %s again",
			e.label(), left, v.size, strings.Join(v.keptAbsent, ", "), isVoters(len(v.keptAbsent)))
	}
	if e.Leader {
		// Rule 5: removing the leader leaves the cluster leaderless for an
		// election (1.5-2.4 s measured); MoveLeader first costs 0.1 s.
		to := v.successor(e, after)
		if to == nil {
			if s := v.startingSuccessor(e); s != nil {
				return waitStep(RuleLeaderLast, "%s: leader %s is departing; %s takes over once it serves clients (connected for %s)", startWord(s), e.label(), s.label(), s.ConnectedFor)
			}
			return waitStep(RuleLeaderLast, "NoLeaderSuccessor: leader %s is departing and no healthy member that stays can take over", e.label())
		}
		return to.step(MoveLeader, RuleLeaderLast, fmt.Sprintf("leader %s is departing; %s takes over first", e.label(), to.label()))
	}
	if s, wait := v.unstartedBeforeTie(after, "removing "+e.label()); wait {
		return s
	}
	if s, move := v.leaderBeforeTie(after, e); move {
		return s
	}
	return e.step(Remove, rule, why)
}

// leaderToMajority moves leadership to the goal side as soon as that side
// holds the majority and the leader is on the other: departing, or kept
// there for a while (a source member a move retains for clients it could
// not switch yet), whose commits would otherwise all cross the link.
//
// Rule 6 allows two moments: before the change that makes the tie, or right
// after the removal that ends it. We move after, because then
//   - the new leader's side holds the majority: its first commit of its
//     term, which etcd needs before it serves a read, and every commit
//     after it stay inside that side. Moved before the tie, the new leader
//     sat in the minority and each commit crossed the link twice more: at
//     180 ms RTT the destination's clients waited 0.74-1.08 s at the
//     transfer instead of about one round trip;
//   - the leader stays on the majority side until the tie: moved before it,
//     it sat in the minority from the transfer to the tie (the drain and
//     the promotion call, 3-4 s), a window in which a cut between the sides
//     costs the majority side an election (1.5-2.4 s without a leader
//     measured); moved after, that window is the controller's next round
//     and the transfer (1-2.5 s at 180 ms RTT);
//   - the tie stays exactly one change long: the promotion and the removal
//     that ends it go in one call (the departing leader is removed last,
//     rule 5), and moving at the tie measured a 0.82 s tie, of which
//     MoveLeader across sites alone is 0.6 s;
//   - MoveLeader drops forwarded proposals while it runs, so it must happen once
//     per move: the member chosen stays, and no later step has to move it again.
//
// Two exceptions: when the leader is the only voter whose removal could
// end a tie, it moves before the promotion that makes the tie
// (leaderBeforeTie), or, with no voter on the goal side yet (a one-member
// cluster moving), at that removal (rule 5); and while rule 10 holds the
// leader's removal until the members the target keeps are back, so does
// its move.
func (v *view) leaderToMajority() (Step, bool) {
	counts := v.voterCounts()
	if v.goal == "" || holder(counts) != v.goal || v.leader.Side == v.goal || v.leader.role == unmanaged || len(v.keptAbsent) > 0 {
		return Step{}, false
	}
	to := v.goalSuccessor(counts)
	if to == nil {
		return Step{}, false
	}
	return to.step(MoveLeader, RuleInterleave, fmt.Sprintf("side %s holds the majority; leadership goes to %s there from %s", v.goal, to.label(), v.leader.label())), true
}

// leaderAwayFromGoal tells whether the members are the target's while the
// leader sits on the side that lost the majority (a kept source member
// that an election made leader): the move is not done until leadership
// went over, or every commit keeps crossing the link.
func (v *view) leaderAwayFromGoal() bool {
	if v.leader == nil {
		return false
	}
	_, move := v.leaderToMajority()
	return move
}

// leaderBeforeTie moves leadership to the goal side before a change (the
// removal of removed, or a promotion) that makes a tie which only the
// leader's own removal could end: the leader is then the last departing
// voter on its side, and removing it at the tie would need a MoveLeader in
// the middle of the tie (see leaderToMajority).
func (v *view) leaderBeforeTie(after map[string]int, removed *member) (Step, bool) {
	if !v.makesTie(after) || v.leader.Side == v.goal || v.leader.role != departing {
		return Step{}, false
	}
	for _, m := range v.voters {
		if m != v.leader && m != removed && m.role == departing && m.Side == v.leader.Side {
			return Step{}, false // the tie ends with m's removal; the leader moves after it
		}
	}
	to := v.goalSuccessor(after)
	if to == nil {
		return Step{}, false
	}
	return to.step(MoveLeader, RuleInterleave, fmt.Sprintf("the next change makes a tie that only the removal of leader %s could end; leadership goes to %s on side %s first", v.leader.label(), to.label(), v.goal)), true
}

// goalSuccessor is the leader's successor (see successor) when it is on
// the goal side, else nil.
func (v *view) goalSuccessor(after map[string]int) *member {
	if to := v.successor(v.leader, after); to != nil && to.Side == v.goal {
		return to
	}
	return nil
}

// addLearner adds w as a learner if the learner slot is free.
func (v *view) addLearner(w *Want, p Policy) Step {
	if w.PodNotWaiting != "" {
		// Rule 2: a learner added before its pod runs is a member that
		// cannot start for as long as the pod takes: it holds a learner
		// slot, and the next learner's start waits for its own.
		return waitStep(RuleOneLearner, "WaitingForPod: %s is added once its pod waits for it: %s", w.Name, w.PodNotWaiting)
	}
	if len(v.learners) >= p.MaxLearners {
		if !v.isLearnerOnly(w) {
			for _, l := range v.learners {
				if l.role == learnerOnly {
					// A member to vote comes before one to wait as a
					// learner; a learner holds no vote, so its removal
					// never risks quorum, and it joins again later.
					return l.step(Remove, RuleOneLearner, fmt.Sprintf("learner %s, wanted as a learner only, gives its learner slot to %s, which is to vote", l.label(), w.Name))
				}
			}
		}
		// Rule 2: etcd refuses more learners than --max-learners, and two
		// catching up at once share the leader's bandwidth.
		l := v.learners[0]
		rule := RuleOneLearner
		if l.role == unmanaged {
			rule = RuleUnmanaged // Rule 7: it is not ours, so we wait instead of removing it
		}
		return waitStep(rule, "WaitingForLearnerSlot: learner %s%s holds the learner slot; %s waits", l.label(), l.roleNote(), w.Name)
	}
	for _, m := range v.members {
		if sharesURL(m.PeerURLs, w.PeerURLs) {
			return waitStep(RuleValidTarget, "PeerURLConflict: %s%s already uses a peer URL of %s", m.label(), m.roleNote(), w.Name)
		}
	}
	why := fmt.Sprintf("%s joins side %s as a learner", w.Name, w.Side)
	if v.isLearnerOnly(w) {
		why += ", and stays one until it is wanted as a voter"
	}
	return Step{Kind: AddLearner, Member: w.Name, PeerURLs: slices.Clone(w.PeerURLs), Rule: RuleInterleave, Reason: why}
}

// isLearnerOnly tells whether w is wanted as a learner only.
func (v *view) isLearnerOnly(w *Want) bool {
	return v.roles[w.Name] == learnerOnly
}

// slotNote names, at the target, the members wanted as learners that wait
// for a learner slot.
func (v *view) slotNote(p Policy) string {
	if len(v.missingLearners) == 0 {
		return ""
	}
	var names []string
	for _, w := range v.missingLearners {
		names = append(names, w.Name)
	}
	return fmt.Sprintf("; %s wait(s) for a learner slot (etcd's --max-learners, %d, are taken)", strings.Join(names, ", "), p.MaxLearners)
}

func isVoters(n int) string {
	if n == 1 {
		return "is a voter"
	}
	return "are voters"
}

func waitStep(rule, format string, args ...any) Step {
	return Step{Kind: Wait, Rule: rule, Reason: fmt.Sprintf(format, args...)}
}

// readyIn sets s.ReadyIn for a learner connected (or healthy) for settled:
// the rest of MinHealthyFor. Not yet connected at all, its wait's end is
// not known.
func readyIn(s Step, settled time.Duration, p Policy) Step {
	if settled > 0 && settled < p.MinHealthyFor {
		s.ReadyIn = p.MinHealthyFor - settled
	}
	return s
}

func quorum(voters int) int { return voters/2 + 1 }
