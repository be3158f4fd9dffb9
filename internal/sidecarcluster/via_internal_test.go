package sidecarcluster

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// viaMember is one member of a via case: its name starts with its side
// ("a-1" is on side a); role is "leader", "follower", "learner" or "down"
// (a follower that did not answer the poll).
type viaMember struct{ name, role string }

// viaCluster builds the observation, the endpoints (one sidecar per
// member, in the order given) and the planner's input of a via case. The
// observation comes through the first member's sidecar.
func viaCluster(ms ...viaMember) (*Observation, []Endpoint, planner.Observed) {
	list := &sidecar.MemberList{}
	var endpoints []Endpoint
	var in planner.Observed
	for _, m := range ms {
		id := "id-" + m.name
		list.Members = append(list.Members, sidecar.Member{ID: id, Name: m.name,
			IsLeader: m.role == "leader", IsLearner: m.role == "learner", Healthy: m.role != "down"})
		endpoints = append(endpoints, Endpoint{Member: m.name, URL: "https://" + m.name + ":9443"})
		side, _, _ := strings.Cut(m.name, "-")
		in.Members = append(in.Members, planner.Member{ID: id, Name: m.name, Side: side,
			Leader: m.role == "leader", Learner: m.role == "learner", Healthy: m.role != "down"})
	}
	return &Observation{List: list, Via: endpoints[0]}, endpoints, in
}

// TestRemovalGoesThroughAFollower: a removal goes through the sidecar of a
// healthy follower that is neither the member removed nor the leader,
// preferring the departing side's followers, then the caller's side; the
// leader takes it only when no such follower is there. After a snapshot
// join etcd's leader re-dates the new voter's connected-since time and its
// strict reconfiguration check refuses the removal for 5 s; a follower
// does not. Every other step goes through the leader's sidecar.
func TestRemovalGoesThroughAFollower(t *testing.T) {
	remove := func(name string) planner.Step {
		return planner.Step{Kind: planner.Remove, Member: name, ID: "id-" + name}
	}
	for _, tc := range []struct {
		name      string
		members   []viaMember
		localSide string
		step      planner.Step
		failed    []string // sidecars that failed a call just now
		want      string
	}{
		{name: "a follower of the departing side, not the leader",
			members: []viaMember{{"a-0", "leader"}, {"b-0", "follower"}, {"a-1", "follower"}, {"a-2", "follower"}, {"b-1", "learner"}},
			step:    remove("a-1"), want: "a-2"},
		{name: "the departing side first, whatever the caller's side",
			members:   []viaMember{{"a-0", "leader"}, {"b-0", "follower"}, {"a-1", "follower"}, {"a-2", "follower"}},
			localSide: "b", step: remove("a-1"), want: "a-2"},
		{name: "the tie's removal, sent with the promotion: a follower beside the leader, never the learner promoted",
			members: []viaMember{{"b-1", "learner"}, {"b-0", "follower"}, {"a-0", "leader"}, {"a-1", "follower"}, {"a-2", "follower"}},
			step:    remove("a-1"), want: "a-2"},
		{name: "no other follower on the departing side: one on the caller's side",
			members:   []viaMember{{"a-0", "leader"}, {"a-1", "follower"}, {"b-0", "follower"}, {"c-0", "follower"}},
			localSide: "c", step: remove("a-1"), want: "c-0"},
		{name: "no other follower on the departing side and no side of the caller: any follower",
			members: []viaMember{{"a-0", "leader"}, {"a-1", "follower"}, {"b-0", "follower"}},
			step:    remove("a-1"), want: "b-0"},
		{name: "a follower that does not answer is passed by",
			members: []viaMember{{"a-0", "leader"}, {"a-1", "follower"}, {"a-2", "down"}, {"b-0", "follower"}},
			step:    remove("a-1"), want: "b-0"},
		{name: "a follower whose sidecar failed just now is passed by",
			members: []viaMember{{"a-0", "leader"}, {"a-1", "follower"}, {"a-2", "follower"}, {"b-0", "follower"}},
			step:    remove("a-1"), failed: []string{"a-2"}, want: "b-0"},
		{name: "no healthy follower but the member removed: the leader",
			members: []viaMember{{"a-1", "follower"}, {"a-0", "leader"}, {"a-2", "down"}, {"b-0", "learner"}},
			step:    remove("a-1"), want: "a-0"},
		{name: "a learner's removal goes through a follower too",
			members: []viaMember{{"a-0", "leader"}, {"a-1", "follower"}, {"b-0", "learner"}},
			step:    remove("b-0"), want: "a-1"},
		{name: "a promotion goes to the leader",
			members: []viaMember{{"a-1", "follower"}, {"a-0", "leader"}, {"b-0", "learner"}},
			step:    planner.Step{Kind: planner.Promote, Member: "b-0", ID: "id-b-0"}, want: "a-0"},
		{name: "a leader transfer goes to the leader",
			members: []viaMember{{"b-0", "follower"}, {"a-1", "follower"}, {"a-0", "leader"}},
			step:    planner.Step{Kind: planner.MoveLeader, Member: "b-0", ID: "id-b-0"}, want: "a-0"},
		{name: "an add goes to the leader",
			members: []viaMember{{"a-1", "follower"}, {"a-0", "leader"}},
			step:    planner.Step{Kind: planner.AddLearner, Member: "b-0"}, want: "a-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			c, err := New(Config{Holder: "via-test", LocalSide: tc.localSide})
			g.Expect(err).NotTo(HaveOccurred())
			obs, endpoints, in := viaCluster(tc.members...)
			for _, name := range tc.failed {
				for _, e := range endpoints {
					if e.Member == name {
						c.noteFailure(e, true)
					}
				}
			}
			got, ok := c.via(obs, endpoints, tc.step, in, false)
			g.Expect(ok).To(BeTrue())
			g.Expect(got.Member).To(Equal(tc.want))
		})
	}
}

// TestTieAtTheLeaderWhenItsCheckCounts: the tie (a promotion with the
// removal that ends it) goes through the leader's sidecar only when the
// observation came through it and the leader's strict reconfiguration
// check, as its transport showed, passes the removal right after the
// promotion: the voters connected to the leader for 5 s (the leader and
// the member removed included) less one make a quorum of the voters but
// one. The leader re-dates a new voter's connection after its snapshot
// join; a follower does not, so otherwise the tie stays with removalVia.
func TestTieAtTheLeaderWhenItsCheckCounts(t *testing.T) {
	const settled = 5 * time.Second
	rm := planner.Step{Kind: planner.Remove, Member: "a-1", ID: "id-a-1"}
	for _, tc := range []struct {
		name        string
		members     []viaMember // after the promotion; the first answered the observation
		connected   map[string]time.Duration
		transportOf string // default: the first member's
		want        bool
	}{
		{name: "every voter connected to the leader for 5 s",
			members:   []viaMember{{"a-0", "leader"}, {"a-1", "follower"}, {"b-0", "follower"}, {"b-1", "follower"}},
			connected: map[string]time.Duration{"a-1": time.Minute, "b-0": time.Minute, "b-1": time.Minute}, want: true},
		{name: "the voter just promoted re-dated by its snapshot, but the others make the quorum",
			members:   []viaMember{{"a-0", "leader"}, {"a-1", "follower"}, {"b-0", "follower"}, {"b-1", "follower"}},
			connected: map[string]time.Duration{"a-1": time.Minute, "b-0": time.Minute, "b-1": time.Second}, want: true},
		{name: "two voters re-dated: the leader's check would refuse, a follower's would not",
			members:   []viaMember{{"a-0", "leader"}, {"a-1", "follower"}, {"b-0", "follower"}, {"b-1", "follower"}},
			connected: map[string]time.Duration{"a-1": time.Minute, "b-0": 4 * time.Second, "b-1": time.Second}},
		{name: "observed through a follower: its transport is not the leader's",
			members:   []viaMember{{"b-0", "follower"}, {"a-0", "leader"}, {"a-1", "follower"}, {"b-1", "follower"}},
			connected: map[string]time.Duration{"a-0": time.Minute, "a-1": time.Minute, "b-1": time.Minute}},
		{name: "the leader's sidecar answered without its transport",
			members:   []viaMember{{"a-0", "leader"}, {"a-1", "follower"}, {"b-0", "follower"}, {"b-1", "follower"}},
			connected: map[string]time.Duration{"a-1": time.Minute, "b-0": time.Minute, "b-1": time.Minute}, transportOf: "none"},
		{name: "learners do not count",
			members:   []viaMember{{"a-0", "leader"}, {"a-1", "follower"}, {"b-0", "follower"}, {"b-1", "learner"}, {"b-2", "learner"}},
			connected: map[string]time.Duration{"a-1": time.Minute, "b-0": time.Second, "b-1": time.Minute, "b-2": time.Minute}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			obs, _, in := viaCluster(tc.members...)
			obs.List.TransportOf = "id-" + tc.members[0].name
			if tc.transportOf != "" {
				obs.List.TransportOf = tc.transportOf
			}
			for i := range in.Members {
				in.Members[i].ConnectedFor = tc.connected[in.Members[i].Name]
			}
			g.Expect(leaderCountsRemoval(obs, in.Members, rm, settled)).To(Equal(tc.want))
		})
	}
}
