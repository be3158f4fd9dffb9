package planner

import (
	"slices"
	"strings"

	"github.com/druid-stretch/druid-stretch/internal/peerurl"
)

// role says who decides about a member.
type role int

const (
	unmanaged   role = iota // in no list: never touched (rule 7)
	owned                   // in Desired.Add
	kept                    // in Desired.Keep
	departing               // in Desired.Remove
	learnerOnly             // in Desired.Learners: ours, never promoted
)

// member is an observed member with its role and the name it goes by.
type member struct {
	Member
	name string // Name, or the Add name an unstarted learner matched by peer URL
	role role
}

// view is the observation sorted out against the desired membership.
type view struct {
	members  []*member
	voters   []*member
	learners []*member
	leader   *member
	missing  []*Want // targets that are not members yet, in the order of Desired.Add
	// missingLearners are the members of Desired.Learners that are not
	// members yet, in its order.
	missingLearners []*Want
	// size is how many voters the target has: Desired.Add and Desired.Keep.
	size int
	// keptAbsent are the names in Desired.Keep that are not voters now.
	keptAbsent []string
	// goal is the side that holds the majority once the target is reached;
	// when no side will, the side that holds it now, if any.
	goal string
	// want is the desired membership the view was sorted out against.
	want Desired
	// roles is the role of every name in want.
	roles map[string]role
}

func newView(obs Observed, want Desired) (*view, Step, bool) {
	roles := map[string]role{}
	v := &view{want: want, roles: roles}
	for _, n := range want.Keep {
		roles[n] = kept
	}
	for _, n := range want.Remove {
		roles[n] = departing
	}
	wants := map[string]*Want{}
	for i := range want.Add {
		roles[want.Add[i].Name] = owned
		wants[want.Add[i].Name] = &want.Add[i]
	}
	for i := range want.Learners {
		roles[want.Learners[i].Name] = learnerOnly
		wants[want.Learners[i].Name] = &want.Learners[i]
	}
	ownWants := slices.Concat(want.Add, want.Learners)
	found := map[string]bool{}
	for _, m := range obs.Members {
		e := &member{Member: m, name: m.Name}
		if e.name == "" {
			for _, w := range ownWants {
				if sharesURL(m.PeerURLs, w.PeerURLs) {
					e.name = w.Name // an unstarted learner only has its peer URLs
				}
			}
		}
		if e.name != "" {
			e.role = roles[e.name]
		}
		if w := wants[e.name]; e.role == owned || e.role == learnerOnly {
			if !sharesURL(m.PeerURLs, w.PeerURLs) {
				return nil, waitStep(RuleValidTarget, "PeerURLMismatch: member %s has peer URLs %v, the target says %v", e.name, m.PeerURLs, w.PeerURLs), true
			}
			if e.role == learnerOnly && !e.Learner {
				return nil, waitStep(RuleValidTarget, "InvalidTarget: %s is wanted as a learner only, but it votes already, and etcd cannot make a voter a learner again: want it as a voter", e.name), true
			}
			e.Side = w.Side
			found[e.name] = true
		}
		v.members = append(v.members, e)
		if e.Learner {
			v.learners = append(v.learners, e)
		} else {
			v.voters = append(v.voters, e)
		}
		if e.Leader {
			v.leader = e
		}
	}
	final := map[string]int{}
	for _, m := range v.voters {
		if m.role == kept || m.role == unmanaged {
			final[m.Side]++
		}
	}
	for i := range want.Add {
		final[want.Add[i].Side]++
		if !found[want.Add[i].Name] {
			v.missing = append(v.missing, &want.Add[i])
		}
	}
	for i := range want.Learners {
		if !found[want.Learners[i].Name] {
			v.missingLearners = append(v.missingLearners, &want.Learners[i])
		}
	}
	v.size = len(want.Add) + len(want.Keep)
	for _, n := range want.Keep {
		if !slices.ContainsFunc(v.voters, func(m *member) bool { return m.name == n }) {
			v.keptAbsent = append(v.keptAbsent, n)
		}
	}
	v.goal = holder(final)
	if v.goal == "" {
		// The target is a tie: keep the majority where it is until the last
		// change, rather than moving it across and back.
		v.goal = holder(v.voterCounts())
	}
	byName := func(a, b *member) int { return strings.Compare(a.label(), b.label()) }
	slices.SortFunc(v.members, byName)
	slices.SortFunc(v.voters, byName)
	slices.SortFunc(v.learners, byName)
	return v, Step{}, false
}

// reached reports whether every target is a voter, every departing member
// gone, and every member wanted as a learner only is one, or waits for a
// learner slot that the learners present fill.
func (v *view) reached(p Policy) bool {
	if len(v.missing) > 0 || (len(v.missingLearners) > 0 && len(v.learners) < p.MaxLearners) {
		return false
	}
	for _, m := range v.members {
		if m.role == departing || (m.role == owned && m.Learner) {
			return false
		}
	}
	return true
}

// nextRemoval is the departing voter to remove next: one off the goal side,
// and not the leader while another will do.
func (v *view) nextRemoval() *member {
	var best *member
	rank := func(m *member) []int {
		return []int{boolRank(v.goal == "" || m.Side != v.goal), boolRank(!m.Leader)}
	}
	for _, m := range v.voters {
		if m.role != departing {
			continue
		}
		if best == nil || slices.Compare(rank(m), rank(best)) < 0 {
			best = m
		}
	}
	return best
}

// nextAdd is the member to add next: the first missing one whose pod
// waits for it, else the first missing one.
func (v *view) nextAdd() *Want {
	return firstWaiting(v.missing)
}

// firstWaiting is the first of ws whose pod waits for it, else the first
// (nil if none).
func firstWaiting(ws []*Want) *Want {
	for _, w := range ws {
		if w.PodNotWaiting == "" {
			return w
		}
	}
	if len(ws) == 0 {
		return nil
	}
	return ws[0]
}

// nextLearnerOnly is the member wanted as a learner only to add next: once
// every voter to be is in and no voter departs, since it adds no vote and
// rule 6's order of additions and removals is about votes.
func (v *view) nextLearnerOnly() *Want {
	if len(v.missing) > 0 || len(v.missingLearners) == 0 || v.departingVoters() > 0 {
		return nil
	}
	return firstWaiting(v.missingLearners)
}

// ownLearners are the learners this caller added: those it will promote
// and those it wants as learners only.
func (v *view) ownLearners() []*member {
	var out []*member
	for _, l := range v.learners {
		if l.role == owned || l.role == learnerOnly {
			out = append(out, l)
		}
	}
	return out
}

// successor is the healthy voter that stays to take leadership from the
// current leader: on the goal side if possible, else on the side holding the
// majority after the change. Unmanaged members are never chosen (rule 7).
func (v *view) successor(exclude *member, after map[string]int) *member {
	next := holder(after)
	var best *member
	rank := func(m *member) []int {
		return []int{boolRank(m.Side == v.goal && v.goal != ""), boolRank(m.Side == next && next != "")}
	}
	for _, m := range v.voters {
		if m == exclude || !m.Healthy || !m.stays() {
			continue
		}
		if best == nil || slices.Compare(rank(m), rank(best)) < 0 {
			best = m
		}
	}
	return best
}

// startingSuccessor is a voter that stays and does not serve clients yet
// (a learner promoted before its publish, or just after it, before its
// client port answers): it cannot take leadership now, but will once its
// etcd serves, within seconds.
func (v *view) startingSuccessor(exclude *member) *member {
	for _, m := range v.voters {
		if m != exclude && (m.Unstarted || m.Unanswered) && !m.Healthy && m.stays() {
			return m
		}
	}
	return nil
}

func (v *view) departingVoters() int {
	n := 0
	for _, m := range v.voters {
		if m.role == departing {
			n++
		}
	}
	return n
}

func (v *view) voterCounts() map[string]int {
	counts := map[string]int{}
	for _, m := range v.voters {
		counts[m.Side]++
	}
	return counts
}

func (v *view) countsWithout(rm *member) map[string]int {
	counts := v.voterCounts()
	counts[rm.Side]--
	return counts
}

func (v *view) unmanagedNote() string {
	var names []string
	for _, m := range v.members {
		if m.role == unmanaged {
			names = append(names, m.label())
		}
	}
	if len(names) == 0 {
		return ""
	}
	return "; unmanaged, left alone: " + strings.Join(names, ", ")
}

// holder is the side whose voters are more than half of all voters, "" if none.
func holder(counts map[string]int) string {
	total := 0
	for _, n := range counts {
		total += n
	}
	for side, n := range counts {
		if 2*n > total {
			return side
		}
	}
	return ""
}

// stays tells whether m is a member of ours that the target keeps: only
// such a member may take leadership (rule 7 leaves unmanaged ones alone).
func (m *member) stays() bool { return m.role == owned || m.role == kept }

func (m *member) step(kind StepKind, rule, reason string) Step {
	return Step{Kind: kind, Member: m.name, ID: m.ID, PeerURLs: slices.Clone(m.PeerURLs), Rule: rule, Reason: reason}
}

// label names a member for people, even before it has a name.
func (m *member) label() string {
	switch {
	case m.name != "":
		return m.name
	case len(m.PeerURLs) > 0:
		return "unstarted " + m.PeerURLs[0]
	default:
		return "member " + m.ID
	}
}

func (m *member) roleNote() string {
	switch m.role {
	case unmanaged:
		return " (unmanaged)"
	case kept:
		return " (kept)"
	}
	return ""
}

// sharesURL tells whether a and b name a common peer, by peerurl.Key:
// another spelling of a learner's peer URL is the same learner.
func sharesURL(a, b []string) bool { return peerurl.Shares(a, b) }

func boolRank(preferred bool) int {
	if preferred {
		return 0
	}
	return 1
}
