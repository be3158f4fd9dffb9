package site

import (
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// etcdLogOfMoves is the shape of what an etcd v3.6 member logs when it
// applies membership changes (membership/cluster.go), among other lines:
// member 3 removes member 1, then adds learner 5; a restart replays an add.
const etcdLogOfMoves = `{"level":"info","ts":"2026-11-28T07:37:22.535519Z","caller":"membership/cluster.go:550","msg":"promote member","cluster-id":"15e4e1c31013a692","local-member-id":"3","promoted-member-id":"3"}
{"level":"info","ts":"2026-11-28T07:37:22.600000Z","caller":"etcdserver/server.go:1","msg":"applied a configuration change through raft","local-member-id":"3"}
not a JSON line: the stand-in's own output
{"level":"info","ts":"2026-11-28T07:37:23.007312Z","caller":"membership/cluster.go:460","msg":"removed member","cluster-id":"15e4e1c31013a692","local-member-id":"3","removed-remote-peer-id":"a1","removed-remote-peer-urls":["http://etcd-main-0:2380"],"removed-remote-peer-is-learner":false}
{"level":"info","ts":"2026-11-28T07:37:23.054812Z","caller":"membership/cluster.go:424","msg":"added member","cluster-id":"15e4e1c31013a692","local-member-id":"3","added-peer-id":"b5","added-peer-peer-urls":["http://etcd-main-4:2380"],"added-peer-is-learner":true}
{"level":"info","ts":"2026-11-28T07:37:24.000000Z","caller":"membership/cluster.go:424","msg":"added member","cluster-id":"15e4e1c31013a692","local-member-id":"3","added-peer-id":"b5","added-peer-peer-urls":["http://etcd-main-4:2380"],"added-peer-is-learner":true}
`

func TestAppliedConfChanges(t *testing.T) {
	g := NewWithT(t)
	g.Expect(AppliedConfChanges(etcdLogOfMoves)).To(Equal([]ConfChange{
		{Kind: ConfChangePromote, ID: 0x3},
		{Kind: ConfChangeRemove, ID: 0xa1},
		{Kind: ConfChangeAdd, ID: 0xb5},
		{Kind: ConfChangeAdd, ID: 0xb5},
	}))
	g.Expect(AppliedConfChanges("")).To(BeEmpty())
}

// TestTransitionsInApplyOrder: a removal and the add sent right after it,
// seen by one poll, come apart in the order the member applied them; what
// the log does not order stays one transition, so it fails a shape check.
func TestTransitionsInApplyOrder(t *testing.T) {
	g := NewWithT(t)
	h := &MembershipHistory{}
	at := time.Now()
	for i, list := range [][]MemberState{
		{{ID: 0xa1, Name: "etcd-main-0"}, {ID: 0xa2, Name: "etcd-main-1"}, {ID: 0x3, Name: "etcd-main-3", Learner: true}},
		{{ID: 0xa1, Name: "etcd-main-0"}, {ID: 0xa2, Name: "etcd-main-1"}, {ID: 0x3, Name: "etcd-main-3"}},
		// One poll: etcd-main-0 removed and a learner added.
		{{ID: 0xa2, Name: "etcd-main-1"}, {ID: 0x3, Name: "etcd-main-3"}, {ID: 0xb5, Learner: true}},
		// One poll: etcd-main-1 removed and an unknown learner added.
		{{ID: 0x3, Name: "etcd-main-3"}, {ID: 0xb5, Learner: true}, {ID: 0xc7, Learner: true}},
	} {
		h.lists = append(h.lists, list)
		h.seen = append(h.seen, at.Add(time.Duration(i)*100*time.Millisecond))
	}
	g.Expect(h.Transitions()).To(Equal([]string{
		"promote etcd-main-3",
		"add learner (unnamed) + remove etcd-main-0",
		"add learner (unnamed) + remove etcd-main-1",
	}), "the poll alone cannot order them")
	g.Expect(h.TransitionsInApplyOrder(AppliedConfChanges(etcdLogOfMoves))).To(Equal([]string{
		"promote etcd-main-3",
		"remove etcd-main-0",
		"add learner (unnamed)",
		"add learner (unnamed) + remove etcd-main-1",
	}))
}

// TestFewestVoters: the dip counts from the first list with the fewest
// voters until the first list with more; a learner added meanwhile does
// not end it.
func TestFewestVoters(t *testing.T) {
	g := NewWithT(t)
	h := &MembershipHistory{}
	at := time.Now()
	for i, list := range [][]MemberState{
		{{ID: 0xa1}, {ID: 0x3}, {ID: 0x4}},
		{{ID: 0x3}, {ID: 0x4}},
		{{ID: 0x3}, {ID: 0x4}, {ID: 0x5, Learner: true}},
		{{ID: 0x3}, {ID: 0x4}, {ID: 0x5}},
	} {
		h.lists = append(h.lists, list)
		h.seen = append(h.seen, at.Add(time.Duration(i)*time.Second))
	}
	n, from, lasted := h.FewestVoters()
	g.Expect(n).To(Equal(2))
	g.Expect(from).To(Equal(at.Add(time.Second)))
	g.Expect(lasted).To(Equal(2 * time.Second))
}

// TestLearnersAddedAgainAreLeftOut: the sidecar removes a learner whose
// member ID falls below every voter's and adds it again a second later;
// the transitions name one add. A learner that started, or stayed long,
// before its removal is a change like any other.
func TestLearnersAddedAgainAreLeftOut(t *testing.T) {
	g := NewWithT(t)
	h := &MembershipHistory{}
	at := time.Now()
	voters := []MemberState{{ID: 0xa1, Name: "etcd-main-0"}, {ID: 0xa2, Name: "etcd-main-1"}}
	with := func(ms ...MemberState) []MemberState { return append(slices.Clone(voters), ms...) }
	for i, list := range [][]MemberState{
		with(),
		with(MemberState{ID: 0x01, Learner: true}), // added low, taken back
		with(),
		with(MemberState{ID: 0xb5, Learner: true}),
		with(MemberState{ID: 0xb5, Name: "etcd-main-3", Learner: true}),
		with(MemberState{ID: 0xb5, Name: "etcd-main-3"}),
		with(MemberState{ID: 0xb5, Name: "etcd-main-3"}, MemberState{ID: 0xc7, Learner: true}),
		with(MemberState{ID: 0xb5, Name: "etcd-main-3"}), // never started, but stayed 10 s
	} {
		h.lists = append(h.lists, list)
		h.seen = append(h.seen, at.Add(time.Duration(i)*100*time.Millisecond))
	}
	h.seen[len(h.seen)-1] = h.seen[len(h.seen)-2].Add(10 * time.Second)
	g.Expect(h.Transitions()).To(Equal([]string{
		"add learner (unnamed)",
		"promote etcd-main-3",
		"add learner (unnamed)",
		"remove ",
	}))
}
