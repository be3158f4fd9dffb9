package site

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// MembershipHistory is every distinct member list a poll saw, in order,
// with when it was first seen.
type MembershipHistory struct {
	mu    sync.Mutex
	lists [][]MemberState
	seen  []time.Time
	// plain are the peer and client URLs of any member seen that are
	// not https.
	plain []string

	cancel context.CancelFunc
	done   chan struct{}
}

// MemberState is one member as a poll saw it.
type MemberState struct {
	ID      uint64
	Name    string
	Learner bool
}

// RecordMembership polls cli's member list every 100 ms until Stop,
// keeping each list that differs from the one before.
func RecordMembership(cli *clientv3.Client) *MembershipHistory {
	ctx, cancel := context.WithCancel(context.Background())
	h := &MembershipHistory{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			callCtx, callCancel := context.WithTimeout(ctx, time.Second)
			resp, err := cli.MemberList(callCtx)
			callCancel()
			if err == nil {
				var list []MemberState
				var plain []string
				for _, m := range resp.Members {
					list = append(list, MemberState{ID: m.ID, Name: m.Name, Learner: m.IsLearner})
					for _, u := range slices.Concat(m.PeerURLs, m.ClientURLs) {
						if !strings.HasPrefix(u, "https://") {
							plain = append(plain, u)
						}
					}
				}
				h.addPlain(plain)
				slices.SortFunc(list, func(a, b MemberState) int { return cmp.Compare(a.ID, b.ID) })
				h.add(list)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return h
}

// Stop ends the polling; the history keeps what it saw. Safe to call twice.
func (h *MembershipHistory) Stop() {
	h.cancel()
	<-h.done
}

func (h *MembershipHistory) addPlain(urls []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, u := range urls {
		if !slices.Contains(h.plain, u) {
			h.plain = append(h.plain, u)
		}
	}
}

// PlainURLs are the member URLs the polls saw that are not https: none
// where etcd runs TLS on client and peer URLs as a seed runs it.
func (h *MembershipHistory) PlainURLs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.plain)
}

// add keeps list when its members or roles differ from the last one; a
// learner that only got its name (etcd names it once it starts) is no
// change.
func (h *MembershipHistory) add(list []MemberState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.lists); n > 0 {
		last := h.lists[n-1]
		if slices.EqualFunc(last, list, func(a, b MemberState) bool { return a.ID == b.ID && a.Learner == b.Learner }) {
			h.lists[n-1] = list // keep the names
			return
		}
	}
	h.lists = append(h.lists, list)
	h.seen = append(h.seen, time.Now())
}

// LongestTie is the longest time the voters were split evenly between the
// members side names and the rest (no side held a majority), as the polls
// saw it (100 ms resolution), and how often that happened.
func (h *MembershipHistory) LongestTie(side func(name string) bool) (longest time.Duration, ties int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, list := range h.lists {
		in, out := 0, 0
		for _, m := range list {
			switch {
			case m.Learner:
			case side(m.Name):
				in++
			default:
				out++
			}
		}
		if in == 0 || in != out {
			continue
		}
		ties++
		end := time.Now()
		if i+1 < len(h.seen) {
			end = h.seen[i+1]
		}
		longest = max(longest, end.Sub(h.seen[i]))
	}
	return longest, ties
}

// FewestVoters is the fewest voters any list had, when a poll first saw
// that, and how long the lists went on having that few (until a list with
// more, or now).
func (h *MembershipHistory) FewestVoters() (n int, from time.Time, lasted time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	voters := make([]int, len(h.lists))
	for i, list := range h.lists {
		for _, m := range list {
			if !m.Learner {
				voters[i]++
			}
		}
	}
	if len(voters) == 0 {
		return 0, time.Time{}, 0
	}
	first := slices.Index(voters, slices.Min(voters))
	end := time.Now()
	for j := first + 1; j < len(voters); j++ {
		if voters[j] != voters[first] {
			end = h.seen[j]
			break
		}
	}
	return voters[first], h.seen[first], end.Sub(h.seen[first])
}

// Last is the member list last seen.
func (h *MembershipHistory) Last() []MemberState {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.lists) == 0 {
		return nil
	}
	return slices.Clone(h.lists[len(h.lists)-1])
}

// Snapshot is every list seen, in order.
func (h *MembershipHistory) Snapshot() [][]MemberState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lists)
}

// Transitions names each change between two consecutive lists; a change
// of more than one member at once is named as such, so that it fails any
// expectation of single steps.
func (h *MembershipHistory) Transitions() []string {
	var out []string
	for _, t := range h.TimedTransitions() {
		out = append(out, t.Change)
	}
	return out
}

// TransitionsInApplyOrder is Transitions with each transition of several
// changes split into single ones in the order an etcd member applied them
// (applied, from AppliedConfChanges). Two changes a planner sends one
// after the other may fall between two polls; the member's log, not the
// poll, says which came first. A transition with a change applied does not
// list stays whole.
func (h *MembershipHistory) TransitionsInApplyOrder(applied []ConfChange) []string {
	pos := map[ConfChange]int{}
	for i, c := range applied {
		if _, ok := pos[c]; !ok {
			pos[c] = i
		}
	}
	var out []string
	for _, t := range h.TimedTransitions() {
		ordered := slices.Clone(t.Changes)
		known := len(ordered) > 1
		for _, c := range ordered {
			_, ok := pos[ConfChange{Kind: c.Kind, ID: c.ID}]
			known = known && ok
		}
		if !known {
			out = append(out, t.Change)
			continue
		}
		slices.SortFunc(ordered, func(a, b MemberChange) int {
			return cmp.Compare(pos[ConfChange{Kind: a.Kind, ID: a.ID}], pos[ConfChange{Kind: b.Kind, ID: b.ID}])
		})
		for _, c := range ordered {
			out = append(out, c.Text)
		}
	}
	return out
}

// Transition is a change of the member list, at the poll that first saw
// it.
type Transition struct {
	At time.Time
	// Change names the changes, sorted by name and joined by " + ".
	Change  string
	Changes []MemberChange
}

// MemberChange is one member's change within a Transition.
type MemberChange struct {
	Kind ConfChangeKind
	ID   uint64
	// Text is "add learner (unnamed)" (etcd names a learner once it
	// starts), "add voter <name>", "promote <name>" or "remove <name>".
	Text string
}

// TimedTransitions are Transitions with when a poll first saw each. A
// learner the sidecar added and removed again at once, to add it again in
// a later second for a higher member ID, is left out (readdedLearners).
func (h *MembershipHistory) TimedTransitions() []Transition {
	h.mu.Lock()
	lists, seen := slices.Clone(h.lists), slices.Clone(h.seen)
	h.mu.Unlock()
	readded := readdedLearners(lists, seen)
	var out []Transition
	for i := 1; i < len(lists); i++ {
		before, after := map[uint64]MemberState{}, map[uint64]MemberState{}
		for _, m := range lists[i-1] {
			before[m.ID] = m
		}
		for _, m := range lists[i] {
			after[m.ID] = m
		}
		var changes []MemberChange
		for id, m := range after {
			old, ok := before[id]
			switch {
			case !ok && m.Learner:
				changes = append(changes, MemberChange{Kind: ConfChangeAdd, ID: id, Text: "add learner (unnamed)"})
			case !ok:
				changes = append(changes, MemberChange{Kind: ConfChangeAdd, ID: id, Text: "add voter " + m.Name})
			case old.Learner && !m.Learner:
				changes = append(changes, MemberChange{Kind: ConfChangePromote, ID: id, Text: "promote " + m.Name})
			}
		}
		for id, m := range before {
			if _, ok := after[id]; !ok {
				changes = append(changes, MemberChange{Kind: ConfChangeRemove, ID: id, Text: "remove " + m.Name})
			}
		}
		changes = slices.DeleteFunc(changes, func(c MemberChange) bool { return readded[c.ID] })
		if len(changes) == 0 {
			continue
		}
		slices.SortFunc(changes, func(a, b MemberChange) int { return cmp.Compare(a.Text, b.Text) })
		texts := make([]string, 0, len(changes))
		for _, c := range changes {
			texts = append(texts, c.Text)
		}
		out = append(out, Transition{At: seen[i], Change: strings.Join(texts, " + "), Changes: changes})
	}
	return out
}

// readdWindow bounds how long a learner the sidecar adds again for a
// higher member ID stays: the removal follows the add at once, and the
// new add comes within the second after.
const readdWindow = 5 * time.Second

// readdedLearners are the IDs of the learners that lists show only as
// learners without a name (they never started), gone by the last list and
// seen for less than readdWindow: the adds the sidecar took back to add
// the learner again for a higher member ID.
func readdedLearners(lists [][]MemberState, seen []time.Time) map[uint64]bool {
	first, gone := map[uint64]time.Time{}, map[uint64]time.Time{}
	started := map[uint64]bool{}
	for i, list := range lists {
		present := map[uint64]bool{}
		for _, m := range list {
			present[m.ID] = true
			if m.Name != "" || !m.Learner {
				started[m.ID] = true
			}
			if _, ok := first[m.ID]; !ok {
				first[m.ID] = seen[i]
			}
			delete(gone, m.ID)
		}
		for id := range first {
			if _, ok := gone[id]; !ok && !present[id] {
				gone[id] = seen[i]
			}
		}
	}
	out := map[uint64]bool{}
	for id, at := range gone {
		if !started[id] && at.Sub(first[id]) < readdWindow {
			out[id] = true
		}
	}
	return out
}

// ConfChangeKind is the kind of a membership change.
type ConfChangeKind string

// The membership changes etcd applies.
const (
	ConfChangeAdd     ConfChangeKind = "add"
	ConfChangePromote ConfChangeKind = "promote"
	ConfChangeRemove  ConfChangeKind = "remove"
)

// ConfChange is one membership change an etcd member applied.
type ConfChange struct {
	Kind ConfChangeKind
	ID   uint64
}

// AppliedConfChanges are the membership changes an etcd member's log
// (etcd's JSON lines; other lines are skipped) says it applied, in the
// order it applied them, which is the raft log's. A member joined later
// lists what it applied from its join on; a restarted member may list a
// change again.
func AppliedConfChanges(etcdLog string) []ConfChange {
	var out []ConfChange
	for line := range strings.Lines(etcdLog) {
		if !strings.Contains(line, " member\"") {
			continue // cheap: most lines are about something else
		}
		var l struct {
			Msg      string `json:"msg"`
			Added    string `json:"added-peer-id"`
			Promoted string `json:"promoted-member-id"`
			Removed  string `json:"removed-remote-peer-id"`
		}
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		kind, hex := ConfChangeKind(""), ""
		switch l.Msg {
		case "added member":
			kind, hex = ConfChangeAdd, l.Added
		case "promote member":
			kind, hex = ConfChangePromote, l.Promoted
		case "removed member":
			kind, hex = ConfChangeRemove, l.Removed
		default:
			continue
		}
		id, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			continue
		}
		out = append(out, ConfChange{Kind: kind, ID: id})
	}
	return out
}
