package sidecar

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// TestParseRaftProgress reads raft.status out of an etcd /debug/vars
// document as etcd v3.6 writes it: a leader's has each member's progress,
// a follower's none, and a member whose raft has not started has null.
func TestParseRaftProgress(t *testing.T) {
	g := NewWithT(t)
	const leader = `{
"cmdline": ["etcd"],
"raft.status": {"id":"8e9e05c52164694d","term":3,"vote":"8e9e05c52164694d","commit":1000,"lead":"8e9e05c52164694d","raftState":"StateLeader","applied":1000,"progress":{"8e9e05c52164694d":{"match":1000,"next":1001,"state":"StateReplicate"},"91bc3c398fb3c146":{"match":998,"next":999,"state":"StateReplicate"},"fd422379fda50e48":{"match":1000,"next":1001,"state":"StateProbe"},"a1":{"match":800,"next":801,"state":"StateReplicate"}},"leadtransferee":"0"},
"memstats": {"Alloc": 1}
}`
	p, err := parseRaftProgress(strings.NewReader(leader))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.leads()).To(BeTrue())
	g.Expect(p.replicating(0x91bc3c398fb3c146)).To(BeTrue(), "replicate, 2 entries behind")
	g.Expect(p.replicating(0xfd422379fda50e48)).To(BeFalse(), "probing: raft does not know it acknowledges")
	g.Expect(p.replicating(0xa1)).To(BeFalse(), "replicate, but its log below 90 % of the commit")
	g.Expect(p.replicating(0x42)).To(BeFalse(), "not in the progress at all")
	// etcd's promotion test: a match at 90 % of the leader's own or more,
	// whatever raft's state of it.
	g.Expect(p.behind(0x91bc3c398fb3c146)).To(BeFalse())
	g.Expect(p.behind(0xfd422379fda50e48)).To(BeFalse(), "probing, but its log is the leader's: etcd promotes it")
	g.Expect(p.behind(0xa1)).To(BeTrue(), "80 % of the leader's match: etcd refuses its promotion")
	g.Expect(p.behind(0x42)).To(BeFalse(), "not in the progress: not known to be behind")

	const follower = `{"raft.status": {"id":"91bc3c398fb3c146","term":3,"vote":"8e9e05c52164694d","commit":1000,"lead":"8e9e05c52164694d","raftState":"StateFollower","applied":1000,"progress":{},"leadtransferee":"0"}}`
	p, err = parseRaftProgress(strings.NewReader(follower))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.leads()).To(BeFalse())
	g.Expect(p.replicating(0x8e9e05c52164694d)).To(BeFalse(), "a follower has no word on anyone")
	g.Expect(p.behind(0x8e9e05c52164694d)).To(BeFalse(), "nor on who is behind")

	_, err = parseRaftProgress(strings.NewReader(`{"raft.status": null}`))
	g.Expect(err).To(MatchError(ContainSubstring("has no raft.status")))
	_, err = parseRaftProgress(strings.NewReader(`{"raft.status": {"id":"zz","lead":"0","raftState":"StateFollower"}}`))
	g.Expect(err).To(MatchError(ContainSubstring(`id "zz" is not a hex member ID`)))
	_, err = parseRaftProgress(strings.NewReader(`<html>`))
	g.Expect(err).To(MatchError(ContainSubstring("parsing the local member's raft status")))
}
