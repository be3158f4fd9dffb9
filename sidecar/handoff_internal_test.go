package sidecar

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestSuccessorPassesOverLeavingMembers: the handoff's successor is a
// voter of the leader's own Etcd, the lowest name first, unless it is
// leaving (drained or being removed); a leaving member is chosen only when
// every other voter leaves too.
func TestSuccessorPassesOverLeavingMembers(t *testing.T) {
	members := []*pb.Member{
		{ID: 1, Name: "etcd-main-0"},
		{ID: 2, Name: "etcd-main-1"},
		{ID: 3, Name: "etcd-main-2"},
		{ID: 4, Name: "etcd-main-3"},
		{ID: 5, Name: "etcd-main-4", IsLearner: true},
		{ID: 6, Name: "etcd-other-0"},
		{ID: 7}, // not started
	}
	for _, c := range []struct {
		name    string
		self    uint64
		leaving map[uint64]bool
		want    string
	}{
		{name: "the lowest name of the own Etcd", self: 3, want: "etcd-main-0"},
		{name: "another Etcd's member last", self: 1, leaving: map[uint64]bool{2: true, 3: true, 4: true}, want: "etcd-other-0"},
		{name: "a drained member passed over", self: 3, leaving: map[uint64]bool{1: true}, want: "etcd-main-1"},
		{name: "two leaving", self: 4, leaving: map[uint64]bool{1: true, 2: true}, want: "etcd-main-2"},
		{name: "every other voter leaving", self: 1, leaving: map[uint64]bool{2: true, 3: true, 4: true, 6: true}, want: "etcd-main-1"},
		{name: "a learner never", self: 4, leaving: map[uint64]bool{1: true, 2: true, 3: true}, want: "etcd-other-0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			to, others := successor(members, c.self, c.leaving)
			if to == nil || to.Name != c.want {
				t.Errorf("successor of member %d with %v leaving: %v, want %s", c.self, c.leaving, to, c.want)
			}
			if len(others) != 4 {
				t.Errorf("the other voters: %d, want 4 (a started voter other than self, leaving or not)", len(others))
			}
		})
	}
}
