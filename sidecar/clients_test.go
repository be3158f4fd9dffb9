package sidecar_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/druid-stretch/druid-stretch/internal/clientgate"
	"github.com/druid-stretch/druid-stretch/internal/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/localetcd/etcdtest"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// gatedSidecar is a sidecar of member m whose clients come through a gate,
// as in a pod druid-stretch's webhook set up; the sidecar serves plain
// HTTP and lets every caller mutate (the refusal tests cover TLS).
func gatedSidecar(t *testing.T, c *etcdtest.Cluster, m *localetcd.Member) (*sidecar.Client, *clientgate.Gate, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	backend, err := url.Parse(m.LocalClientURL)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := c.CA.Issue("gate", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	gate, err := clientgate.New(clientgate.Options{Backend: backend, BackendTLS: m.ClientTLSConfig(),
		ServerTLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gate.Serve(l) }()
	srv, err := sidecar.New(sidecar.Config{
		Endpoints:                    localetcd.SidecarEndpoints(m, c.Runtime.Members()),
		EtcdTLS:                      m.ClientTLSConfig(),
		InsecureAllowUnauthenticated: true,
		ClientGate:                   gate,
		Registry:                     prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		hs.Close()
		_ = srv.Close()
		_ = gate.Close()
		<-served
	})
	return sidecar.NewClient(hs.URL, nil), gate, "https://" + l.Addr().String()
}

// etcdClientT is an etcd client of c's members at url, closed with the test.
func etcdClientT(t *testing.T, c *etcdtest.Cluster, url string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, TLS: c.ClientTLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// The sidecar drains and holds its member's clients through the gate, and
// says it is not ready once drained; bad holds change nothing.
func TestClientGateEndpoints(t *testing.T) {
	g := NewWithT(t)
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 3)})
	sc, gate, gateURL := gatedSidecar(t, c, c.Members[0])
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cli := etcdClientT(t, c, gateURL)
	_, err := cli.Put(ctx, "/through/the/gate", "x")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sc.Ready(ctx)).To(Succeed())

	for _, bad := range []time.Duration{0, -time.Second, sidecar.MaxClientHold + time.Second} {
		_, err := sc.HoldClients(ctx, sidecar.ClientHold{Seconds: bad.Seconds()}, sidecar.CallOptions{})
		g.Expect(sidecar.IsReason(err, sidecar.ReasonInvalidArgument)).To(BeTrue(), "a hold of %s is refused: %v", bad, err)
	}
	put := func() time.Duration {
		start := time.Now()
		_, err := cli.Put(ctx, "/through/the/gate", "y")
		g.Expect(err).NotTo(HaveOccurred())
		return time.Since(start)
	}
	g.Expect(put()).To(BeNumerically("<", 300*time.Millisecond), "the refused holds held nothing")

	st, err := sc.HoldClients(ctx, sidecar.ClientHold{Seconds: 2}, sidecar.CallOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.HeldSeconds).To(Equal(2.0))
	g.Expect(st.InFlight).To(BeZero())
	released := make(chan error, 1)
	time.AfterFunc(300*time.Millisecond, func() { released <- sc.ReleaseClients(ctx, sidecar.CallOptions{}) })
	took := put()
	g.Expect(<-released).To(Succeed())
	g.Expect(took).To(And(BeNumerically(">=", 250*time.Millisecond), BeNumerically("<", 2*time.Second)),
		"the write waited for the hold and went on at its release")

	st, err = sc.DrainClients(ctx, sidecar.CallOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.Ready).To(BeFalse())
	g.Expect(gate.Ready()).To(BeFalse())
	g.Expect(sidecar.IsReason(sc.Ready(ctx), sidecar.ReasonNotReady)).To(BeTrue(), "a drained member's sidecar is not ready")
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	_, err = cli.Put(short, "/through/the/gate", "z")
	g.Expect(err).To(HaveOccurred(), "a drained gate takes no call")
}

// A sidecar without a gate says so, and the caller goes on without.
func TestNoClientGate(t *testing.T) {
	g := NewWithT(t)
	tc := startCluster(t, 1, clusterOptions{})
	c := tc.client(tc.Members[0])
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := c.DrainClients(ctx, sidecar.CallOptions{})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonNoClientGate)).To(BeTrue(), "%v", err)
	_, err = c.HoldClients(ctx, sidecar.ClientHold{Seconds: 1}, sidecar.CallOptions{})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonNoClientGate)).To(BeTrue(), "%v", err)
	g.Expect(c.Ready(ctx)).To(Succeed())
}

// A hold with UntilLeader ends by itself once the local member reports the
// new leader: the held write goes on without a release; a malformed ID is
// refused and holds nothing.
func TestClientHoldEndsWhenTheLeaderMoved(t *testing.T) {
	g := NewWithT(t)
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 3)})
	sc, _, gateURL := gatedSidecar(t, c, c.Members[0])
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cli := etcdClientT(t, c, gateURL)
	_, err := cli.Put(ctx, "/held", "0")
	g.Expect(err).NotTo(HaveOccurred())

	for _, bad := range []string{"xyz", "0", "-1"} {
		_, err := sc.HoldClients(ctx, sidecar.ClientHold{Seconds: 1, UntilLeader: bad}, sidecar.CallOptions{})
		g.Expect(sidecar.IsReason(err, sidecar.ReasonInvalidArgument)).To(BeTrue(), "untilLeader %q is refused: %v", bad, err)
		g.Expect(err).To(MatchError(ContainSubstring(bad)))
	}
	start := time.Now()
	_, err = cli.Put(ctx, "/held", "1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(time.Since(start)).To(BeNumerically("<", time.Second), "the refused holds held nothing")

	// Leadership goes to a member that does not lead now.
	st, err := cli.Status(ctx, gateURL)
	g.Expect(err).NotTo(HaveOccurred())
	members, err := cli.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	var leaderURL string
	var transferee uint64
	for _, m := range members.Members {
		if m.ID == st.Leader {
			leaderURL = m.ClientURLs[0]
		} else if transferee == 0 {
			transferee = m.ID
		}
	}
	_, err = sc.HoldClients(ctx, sidecar.ClientHold{Seconds: sidecar.MaxClientHold.Seconds(), UntilLeader: fmt.Sprintf("%x", transferee)}, sidecar.CallOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	written := make(chan time.Time, 1)
	go func() {
		if _, err := cli.Put(ctx, "/held", "2"); err == nil {
			written <- time.Now()
		}
	}()
	g.Consistently(written).WithTimeout(300*time.Millisecond).ShouldNot(Receive(), "the write waits while the leader has not moved")
	_, err = etcdClientT(t, c, leaderURL).MoveLeader(ctx, transferee)
	g.Expect(err).NotTo(HaveOccurred())
	moved := time.Now()
	var at time.Time
	g.Eventually(written).WithTimeout(3*time.Second).Should(Receive(&at),
		"the write goes on once the member sees the new leader, with no release and before the hold's end")
	t.Logf("the held write was acknowledged %s after MoveLeader returned (before it, when negative)", at.Sub(moved))
	got, err := cli.Get(ctx, "/held")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(got.Kvs[0].Value)).To(Equal("2"))
}

// Through the leader's own sidecar a transfer goes out on the background
// poll's recent health of the target, its checks (lock, fingerprint,
// transferee) read from the leader's own state; a call that fails them,
// or a target that poll found down, is refused, and leadership stays.
func TestMoveLeaderThroughTheLeadersSidecar(t *testing.T) {
	g := NewWithT(t)
	tc := startCluster(t, 3, clusterOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	leaderOf := func() string {
		l, err := tc.client(tc.Members[0]).Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		return leaderName(l)
	}
	var leader, next, down string
	g.Eventually(leaderOf).WithTimeout(30 * time.Second).ShouldNot(BeEmpty())
	leader = leaderOf()
	for _, m := range tc.Members {
		switch {
		case m.Name == leader:
		case next == "":
			next = m.Name
		default:
			down = m.Name
		}
	}
	c := tc.client(tc.Runtime.Member(leader))
	// The leader's sidecar checks on its own member's state, without a
	// read index, and still refuses what the other path refuses.
	_, err := c.MoveLeader(ctx, next, sidecar.CallOptions{LockHolder: "not-the-holder"})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonLockNotHeld)).To(BeTrue(), "%v", err)
	_, err = c.MoveLeader(ctx, next, sidecar.CallOptions{Fingerprint: "0123456789abcdef"})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonMembershipChanged)).To(BeTrue(), "%v", err)
	_, err = c.MoveLeader(ctx, "no-such-member", sidecar.CallOptions{})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonMemberNotFound)).To(BeTrue(), "%v", err)
	g.Expect(leaderOf()).To(Equal(leader), "a refused transfer moves nothing")
	moved, err := c.MoveLeader(ctx, next, sidecar.CallOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(moved.Changed).To(BeTrue())
	g.Expect(moved.Member.Name).To(Equal(next))
	g.Eventually(leaderOf).WithTimeout(10 * time.Second).Should(Equal(next))

	// The new leader's sidecar sees one member stop.
	c = tc.client(tc.Runtime.Member(next))
	g.Expect(tc.Runtime.Member(down).Stop(ctx)).To(Succeed())
	g.Eventually(func(g Gomega) {
		l, err := c.Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(memberByName(l, down).Healthy).To(BeFalse())
	}).WithTimeout(30 * time.Second).Should(Succeed())
	_, err = c.MoveLeader(ctx, down, sidecar.CallOptions{})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonMemberUnhealthy)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(ContainSubstring(down)))
	l, err := c.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(leaderName(l)).To(Equal(next), "leadership stays")
}
