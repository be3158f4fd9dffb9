package sidecar_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestConnectedForFollowsTheTransport reads, through one member's sidecar,
// how long that member's raft transport has had each peer connected: it
// grows while the peer runs, drops to 0 once the peer is stopped (etcd
// deactivates it), and starts again from 0 when the peer is back.
func TestConnectedForFollowsTheTransport(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, 3, clusterOptions{})
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	via, peer := tc.Members[0], tc.Members[2]
	c := tc.client(via)
	ids := map[string]string{}
	for _, m := range tc.MemberList(g) {
		ids[m.Name] = fmt.Sprintf("%x", m.ID)
	}

	connected := func(g Gomega, name string) float64 {
		l, err := c.Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.TransportError).To(BeEmpty())
		g.Expect(l.TransportOf).To(Equal(ids[via.Name]), "the view is that of the sidecar's own member")
		m := memberByName(l, name)
		g.Expect(m).NotTo(BeNil())
		return m.ConnectedForSeconds
	}
	var before float64
	g.Eventually(func(g Gomega) {
		before = connected(g, peer.Name)
		g.Expect(before).To(BeNumerically(">", 1))
		g.Expect(connected(g, tc.Members[1].Name)).To(BeNumerically(">", 1))
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())

	g.Expect(peer.Stop(ctx)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(connected(g, peer.Name)).To(BeZero())
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
	g.Expect(connected(g, tc.Members[1].Name)).To(BeNumerically(">", before), "the other peer stays connected")

	g.Expect(peer.Restart(ctx)).To(Succeed())
	g.Eventually(func(g Gomega) {
		back := connected(g, peer.Name)
		g.Expect(back).To(BeNumerically(">", 0))
		g.Expect(back).To(BeNumerically("<", before), "counted from the reconnection, not from the first connection")
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
}

// TestMembersScrapeTheTransport turns the sidecars' background poll off:
// the member list still tells how long each peer has been connected,
// because an observation scrapes the transport itself when its view is
// older than a moment. With only the background poll, the view lagged
// etcd by up to a poll and a status timeout, and every wait for a
// learner's 5 s connected lasted as much longer.
func TestMembersScrapeTheTransport(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, 3, clusterOptions{pollInterval: -1})
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	via, peer := tc.Members[0], tc.Members[2]
	c := tc.client(via)
	connected := func(g Gomega) float64 {
		l, err := c.Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.TransportError).To(BeEmpty())
		m := memberByName(l, peer.Name)
		g.Expect(m).NotTo(BeNil())
		return m.ConnectedForSeconds
	}
	g.Eventually(func(g Gomega) {
		g.Expect(connected(g)).To(BeNumerically(">", 0.5))
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())

	g.Expect(peer.Stop(ctx)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(connected(g)).To(BeZero())
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
}

// TestParseTransport reads etcd's transport metrics for the local member
// only: whether each peer is active, and how often it was disconnected.
func TestParseTransport(t *testing.T) {
	g := NewWithT(t)
	const text = `# HELP etcd_network_active_peers The current number of active peer connections.
# TYPE etcd_network_active_peers gauge
etcd_network_active_peers{Local="8e9e05c52164694d",Remote="91bc3c398fb3c146"} 1
etcd_network_active_peers{Local="8e9e05c52164694d",Remote="fd422379fda50e48"} 0
etcd_network_active_peers{Local="91bc3c398fb3c146",Remote="a1"} 1
# HELP etcd_network_disconnected_peers_total The total number of disconnected peers.
# TYPE etcd_network_disconnected_peers_total counter
etcd_network_disconnected_peers_total{Local="8e9e05c52164694d",Remote="91bc3c398fb3c146"} 2
etcd_network_disconnected_peers_total{Local="8e9e05c52164694d",Remote="fd422379fda50e48"} 1
# HELP etcd_server_has_leader Whether or not a leader exists. 1 is existence, 0 is not.
# TYPE etcd_server_has_leader gauge
etcd_server_has_leader 1
`
	got, err := sidecar.ParseTransport(text, 0x8e9e05c52164694d)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(map[uint64]sidecar.PeerState{
		0x91bc3c398fb3c146: {Active: true, Disconnects: 2},
		0xfd422379fda50e48: {Active: false, Disconnects: 1},
	}))

	got, err = sidecar.ParseTransport("etcd_server_has_leader 1\n", 0x8e9e05c52164694d)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(BeEmpty(), "no peer was ever active: etcd has not registered the series")

	_, err = sidecar.ParseTransport("etcd_network_active_peers{Local=\n", 1)
	g.Expect(err).To(MatchError(ContainSubstring("parsing the local member's metrics")))
}

// BenchmarkParseTransport reads a metrics text the size of an etcd 3.6
// member's (about 160 KB, 3 peers), as every sidecar does every poll.
func BenchmarkParseTransport(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("# HELP etcd_network_active_peers The current number of active peer connections.\n# TYPE etcd_network_active_peers gauge\n")
	for _, p := range []string{"91bc3c398fb3c146", "fd422379fda50e48", "a1"} {
		fmt.Fprintf(&sb, "etcd_network_active_peers{Local=\"8e9e05c52164694d\",Remote=%q} 1\n", p)
	}
	for i := 0; sb.Len() < 160<<10; i++ {
		fmt.Fprintf(&sb, "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds_bucket{le=\"%d\"} %d\n", i, i*7)
	}
	text := sb.String()
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sidecar.ParseTransport(text, 0x8e9e05c52164694d); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLeaderSidecarReportsReplication: only the leader's sidecar says
// whose raft its member replicates to (the leader's raft.status on
// /debug/vars): every running follower, and no longer one that stopped.
// A follower's sidecar has no such word.
func TestLeaderSidecarReportsReplication(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, 3, clusterOptions{})
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var leader, follower, stopped *localetcd.Member
	g.Eventually(func(g Gomega) {
		l, err := tc.client(tc.Members[0]).Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		name := leaderName(l)
		g.Expect(name).NotTo(BeEmpty())
		leader, follower, stopped = nil, nil, nil
		for _, m := range tc.Members {
			switch {
			case m.Name == name:
				leader = m
			case follower == nil:
				follower = m
			default:
				stopped = m
			}
		}
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())

	word := func(g Gomega, via *localetcd.Member, of func(sidecar.Member) bool) map[string]bool {
		l, err := tc.client(via).Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(leaderName(l)).To(Equal(leader.Name), "the leader stays")
		out := map[string]bool{}
		for _, m := range l.Members {
			out[m.Name] = of(m)
		}
		return out
	}
	replicating := func(g Gomega, via *localetcd.Member) map[string]bool {
		return word(g, via, func(m sidecar.Member) bool { return m.Replicating })
	}
	behind := func(g Gomega, via *localetcd.Member) map[string]bool {
		return word(g, via, func(m sidecar.Member) bool { return m.BehindAtLeader })
	}
	g.Eventually(func(g Gomega) {
		g.Expect(replicating(g, leader)).To(Equal(map[string]bool{leader.Name: false, follower.Name: true, stopped.Name: true}))
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
	g.Expect(replicating(g, follower)).To(Equal(map[string]bool{leader.Name: false, follower.Name: false, stopped.Name: false}),
		"a follower's sidecar has no word on replication")
	g.Expect(behind(g, leader)).To(Equal(map[string]bool{leader.Name: false, follower.Name: false, stopped.Name: false}))

	g.Expect(stopped.Stop(ctx)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(replicating(g, leader)).To(Equal(map[string]bool{leader.Name: false, follower.Name: true, stopped.Name: false}))
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())

	// The cluster writes on without the stopped member: once its log is
	// below 90 % of the leader's, the share etcd asks of a learner's
	// before a promotion, the leader's sidecar says so, of it alone; the
	// follower's still has no word.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{leader.LocalClientURL}, TLS: leader.ClientTLSConfig(), DialTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	g.Eventually(func(g Gomega) {
		_, err := cli.Put(ctx, "/behind", "x")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(behind(g, leader)).To(Equal(map[string]bool{leader.Name: false, follower.Name: false, stopped.Name: true}))
	}).WithTimeout(30 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	g.Expect(behind(g, follower)).To(Equal(map[string]bool{leader.Name: false, follower.Name: false, stopped.Name: false}))
}
