package site

import (
	"cmp"
	"context"
	"slices"
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
				for _, m := range resp.Members {
					list = append(list, MemberState{ID: m.ID, Name: m.Name, Learner: m.IsLearner})
				}
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

// Transition is a change of the member list, at the poll that first saw
// it.
type Transition struct {
	At     time.Time
	Change string
}

// TimedTransitions are Transitions with when a poll first saw each.
func (h *MembershipHistory) TimedTransitions() []Transition {
	h.mu.Lock()
	lists, seen := slices.Clone(h.lists), slices.Clone(h.seen)
	h.mu.Unlock()
	var out []Transition
	for i := 1; i < len(lists); i++ {
		before, after := map[uint64]MemberState{}, map[uint64]MemberState{}
		for _, m := range lists[i-1] {
			before[m.ID] = m
		}
		for _, m := range lists[i] {
			after[m.ID] = m
		}
		var changes []string
		for id, m := range after {
			old, ok := before[id]
			switch {
			case !ok && m.Learner:
				changes = append(changes, "add learner (unnamed)")
			case !ok:
				changes = append(changes, "add voter "+m.Name)
			case old.Learner && !m.Learner:
				changes = append(changes, "promote "+m.Name)
			}
		}
		for id, m := range before {
			if _, ok := after[id]; !ok {
				changes = append(changes, "remove "+m.Name)
			}
		}
		slices.Sort(changes)
		out = append(out, Transition{At: seen[i], Change: strings.Join(changes, " + ")})
	}
	return out
}
