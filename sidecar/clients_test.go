package sidecar_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/druid-stretch/druid-stretch/internal/clientgate"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd/etcdtest"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// gatedSidecar is a sidecar of member m whose clients come through a gate,
// as in a pod druid-stretch's webhook set up; the sidecar serves plain
// HTTP and lets every caller mutate (the refusal tests cover TLS).
func gatedSidecar(t *testing.T, c *etcdtest.Cluster, m *localetcd.Member) (*sidecar.Client, *clientgate.Gate, string) {
	t.Helper()
	sc, _, gate, gateURL := gatedServer(t, c, m)
	return sc, gate, gateURL
}

// gatedServer is gatedSidecar with the sidecar's Server itself.
func gatedServer(t *testing.T, c *etcdtest.Cluster, m *localetcd.Member) (*sidecar.Client, *sidecar.Server, *clientgate.Gate, string) {
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
	cert, err := pair.Certificate()
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
		if err := <-served; err != nil {
			t.Errorf("the gate's Serve after Close: %v", err)
		}
	})
	return sidecar.NewClient(hs.URL, nil), srv, gate, "https://" + l.Addr().String()
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
	testbin.Need(t)
	g := NewWithT(t)
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 3)})
	// A follower: a drained leader's gate reopens (TestUndrainClients).
	_, follower := leaderAndFollower(t, c)
	sc, gate, gateURL := gatedSidecar(t, c, follower)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	o := gateLock(t, sc)
	cli := etcdClientT(t, c, gateURL)
	_, err := cli.Put(ctx, "/through/the/gate", "x")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sc.Ready(ctx)).To(Succeed())

	for _, bad := range []time.Duration{0, -time.Second, sidecar.MaxClientHold + time.Second} {
		_, err := sc.HoldClients(ctx, sidecar.ClientHold{Seconds: bad.Seconds()}, o)
		g.Expect(sidecar.IsReason(err, sidecar.ReasonInvalidArgument)).To(BeTrue(), "a hold of %s is refused: %v", bad, err)
	}
	put := func() time.Duration {
		start := time.Now()
		_, err := cli.Put(ctx, "/through/the/gate", "y")
		g.Expect(err).NotTo(HaveOccurred())
		return time.Since(start)
	}
	g.Expect(put()).To(BeNumerically("<", 300*time.Millisecond), "the refused holds held nothing")

	_, err = sc.HoldClients(ctx, sidecar.ClientHold{Seconds: 2}, sidecar.CallOptions{})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonInvalidArgument)).To(BeTrue(), "a hold without the lock headers is refused: %v", err)
	g.Expect(put()).To(BeNumerically("<", 300*time.Millisecond), "the refused hold held nothing")

	st, err := sc.HoldClients(ctx, sidecar.ClientHold{Seconds: 2}, o)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.HeldSeconds).To(Equal(2.0))
	g.Expect(st.InFlight).To(BeZero())
	_, err = sc.HoldClients(ctx, sidecar.ClientHold{Seconds: 2}, o)
	g.Expect(sidecar.IsReason(err, sidecar.ReasonHoldInForce)).To(BeTrue(), "a hold is not renewed while it is in force: %v", err)
	released := make(chan error, 1)
	time.AfterFunc(300*time.Millisecond, func() { released <- sc.ReleaseClients(ctx, o) })
	took := put()
	g.Expect(<-released).To(Succeed())
	g.Expect(took).To(And(BeNumerically(">=", 250*time.Millisecond), BeNumerically("<", 2*time.Second)),
		"the write waited for the hold and went on at its release")

	st, err = sc.DrainClients(ctx, sidecar.ClientDrain{}, o)
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
	testbin.Need(t)
	g := NewWithT(t)
	tc := startCluster(t, 1, clusterOptions{})
	c := tc.client(tc.Members[0])
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := c.DrainClients(ctx, sidecar.ClientDrain{}, sidecar.CallOptions{})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonNoClientGate)).To(BeTrue(), "%v", err)
	_, err = c.HoldClients(ctx, sidecar.ClientHold{Seconds: 1}, sidecar.CallOptions{})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonNoClientGate)).To(BeTrue(), "%v", err)
	g.Expect(c.Ready(ctx)).To(Succeed())
}

// A hold with UntilLeader ends by itself once the local member reports the
// new leader: the held write goes on without a release; a malformed ID is
// refused and holds nothing.
func TestClientHoldEndsWhenTheLeaderMoved(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 3)})
	sc, _, gateURL := gatedSidecar(t, c, c.Members[0])
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	o := gateLock(t, sc)
	cli := etcdClientT(t, c, gateURL)
	_, err := cli.Put(ctx, "/held", "0")
	g.Expect(err).NotTo(HaveOccurred())

	for _, bad := range []string{"xyz", "0", "-1"} {
		_, err := sc.HoldClients(ctx, sidecar.ClientHold{Seconds: 1, UntilLeader: bad}, o)
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
	_, err = sc.HoldClients(ctx, sidecar.ClientHold{Seconds: sidecar.MaxClientHold.Seconds(), UntilLeader: fmt.Sprintf("%x", transferee)}, o)
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
	testbin.Need(t)
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

// leaderAndFollower names c's leader and one of its followers.
func leaderAndFollower(t *testing.T, c *etcdtest.Cluster) (leader, follower *localetcd.Member) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, m := range c.Members {
		st, err := etcdClientT(t, c, m.ClientURL).Status(ctx, m.ClientURL)
		if err != nil {
			t.Fatal(err)
		}
		if st.Leader == st.Header.MemberId {
			leader = m
		} else if follower == nil {
			follower = m
		}
	}
	if leader == nil || follower == nil {
		t.Fatal("no leader and follower")
	}
	return leader, follower
}

// putThrough writes once through the gate at gateURL, with a short
// timeout: a drained gate takes no call.
func putThrough(t *testing.T, c *etcdtest.Cluster, gateURL string) error {
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err := etcdClientT(t, c, gateURL).Put(ctx, "/through/the/gate", "x")
	return err
}

// A drain whose member's removal does not come ends with its lease: the
// gate reopens by itself, without a call from anyone, and serves clients
// again; the sidecar is ready again. Renewing keeps it drained past the
// first lease.
func TestDrainLeaseRunsOut(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 3)})
	_, follower := leaderAndFollower(t, c)
	sc, gate, gateURL := gatedSidecar(t, c, follower)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	o := gateLock(t, sc)
	g.Expect(putThrough(t, c, gateURL)).To(Succeed())

	for _, bad := range []float64{-1, (sidecar.MaxClientDrain + time.Second).Seconds()} {
		_, err := sc.DrainClients(ctx, sidecar.ClientDrain{Seconds: bad}, o)
		g.Expect(sidecar.IsReason(err, sidecar.ReasonInvalidArgument)).To(BeTrue(), "a lease of %v s is refused: %v", bad, err)
	}
	g.Expect(gate.Ready()).To(BeTrue(), "the refused drains drained nothing")

	const lease = 4 * time.Second
	drained := time.Now()
	st, err := sc.DrainClients(ctx, sidecar.ClientDrain{Seconds: lease.Seconds()}, o)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.Ready).To(BeFalse())
	g.Expect(st.DrainSeconds).To(BeNumerically("~", lease.Seconds(), 0.5))
	g.Expect(sidecar.IsReason(sc.Ready(ctx), sidecar.ReasonNotReady)).To(BeTrue())
	g.Expect(putThrough(t, c, gateURL)).NotTo(Succeed(), "a drained gate takes no call")
	// Renewed before it ends: it lasts another lease from now.
	time.Sleep(lease / 2)
	// Taken before the call: the sidecar starts the new lease while it
	// handles it, so the lease ends no sooner than a lease from here.
	renewed := time.Now()
	_, err = sc.DrainClients(ctx, sidecar.ClientDrain{Seconds: lease.Seconds()}, o)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(gate.Ready).WithTimeout(10*time.Second).WithPolling(20*time.Millisecond).Should(BeTrue(), "the gate reopens when the lease runs out")
	g.Expect(time.Since(renewed)).To(BeNumerically(">=", lease), "not before the renewed lease ran out")
	t.Logf("reopened %s after the drain, %s after its renewal", time.Since(drained), time.Since(renewed))
	g.Eventually(func() error { return putThrough(t, c, gateURL) }).WithTimeout(10*time.Second).Should(Succeed(), "the reopened gate serves clients")
	g.Expect(sc.Ready(ctx)).To(Succeed(), "the sidecar is ready again")
	_, err = sc.DrainClients(ctx, sidecar.ClientDrain{Seconds: lease.Seconds(), Renew: true}, o)
	g.Expect(sidecar.IsReason(err, sidecar.ReasonNotDrained)).To(BeTrue(), "a drain the sidecar ended is not renewed: %v", err)
	g.Expect(gate.Ready()).To(BeTrue())
}

// A drain is undone at once by DELETE /v1/clients/drain, but only by the
// lock's holder when the caller names one; a renewal likewise. A drain of
// the member that leads ends by itself, whatever its lease.
func TestUndrainClients(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 3)})
	leader, follower := leaderAndFollower(t, c)
	sc, gate, gateURL := gatedSidecar(t, c, follower)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const holder = "controller-a"
	token := lockToken(time.Minute)
	_, err := sc.AcquireLock(ctx, holder, token, 30*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	mine := sidecar.CallOptions{LockHolder: holder, LockToken: token}

	_, err = sc.DrainClients(ctx, sidecar.ClientDrain{Seconds: 60}, mine)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(gate.Ready()).To(BeFalse())
	for name, o := range map[string]sidecar.CallOptions{
		"another holder":                {LockHolder: "controller-b"},
		"a stale process of the holder": {LockHolder: holder, LockToken: lockToken(time.Hour)},
	} {
		_, err := sc.UndrainClients(ctx, o)
		g.Expect(sidecar.IsReason(err, sidecar.ReasonLockHeld) || sidecar.IsReason(err, sidecar.ReasonStaleToken)).To(BeTrue(), "%s may not undo the drain: %v", name, err)
		_, err = sc.DrainClients(ctx, sidecar.ClientDrain{Seconds: 60}, o)
		g.Expect(sidecar.IsReason(err, sidecar.ReasonLockHeld) || sidecar.IsReason(err, sidecar.ReasonStaleToken)).To(BeTrue(), "%s may not renew the drain: %v", name, err)
	}
	g.Expect(gate.Ready()).To(BeFalse(), "the refused calls changed nothing")

	st, err := sc.UndrainClients(ctx, mine)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.Ready).To(BeTrue())
	g.Expect(st.DrainSeconds).To(BeZero())
	g.Eventually(func() error { return putThrough(t, c, gateURL) }).WithTimeout(5*time.Second).Should(Succeed(), "the undrained gate serves clients")
	g.Expect(sc.Ready(ctx)).To(Succeed())
	_, err = sc.UndrainClients(ctx, mine)
	g.Expect(err).NotTo(HaveOccurred(), "undoing no drain is a success")

	// The leader's gate, drained for a minute, reopens at the sidecar's
	// next observation.
	lsc, lgate, lgateURL := gatedSidecar(t, c, leader)
	_, err = lsc.DrainClients(ctx, sidecar.ClientDrain{Seconds: 60}, mine)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(lgate.Ready).WithTimeout(10*time.Second).Should(BeTrue(), "a drained leader's gate reopens")
	g.Eventually(func() error { return putThrough(t, c, lgateURL) }).WithTimeout(5 * time.Second).Should(Succeed())
}

// A drain whose member was removed stays: its lease running out does not
// reopen the gate of a member that left the cluster.
func TestDrainOfARemovedMemberStays(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 3)})
	leader, follower := leaderAndFollower(t, c)
	sc, gate, _ := gatedSidecar(t, c, follower)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	o := gateLock(t, sc)
	// The sidecar learns its member's ID from a poll.
	g.Eventually(func() error { return sc.Ready(ctx) }).WithTimeout(10 * time.Second).Should(Succeed())
	const lease = 2 * time.Second
	_, err := sc.DrainClients(ctx, sidecar.ClientDrain{Seconds: lease.Seconds()}, o)
	g.Expect(err).NotTo(HaveOccurred())
	via := etcdClientT(t, c, leader.ClientURL)
	members, err := via.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	var id uint64
	for _, m := range members.Members {
		if m.Name == follower.Name {
			id = m.ID
		}
	}
	// etcd refuses a removal until every member was connected for 5 s;
	// the drain is renewed meanwhile, as the controller renews it until
	// it sends the removal.
	g.Eventually(func() error {
		if _, err := sc.DrainClients(ctx, sidecar.ClientDrain{Seconds: lease.Seconds()}, o); err != nil {
			return err
		}
		_, err := via.MemberRemove(ctx, id)
		return err
	}).WithTimeout(15 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	g.Consistently(gate.Ready).WithTimeout(2*lease+2*time.Second).Should(BeFalse(), "the gate of a removed member stays drained")
	_, err = sc.UndrainClients(ctx, o)
	g.Expect(sidecar.IsReason(err, sidecar.ReasonMemberNotFound)).To(BeTrue(), "%v", err)
	g.Expect(gate.Ready()).To(BeFalse())
}

// A hold waits for its member to see the new leader by asking the member
// for its status, many times a second. A member asked for its status while
// it applies its own removal panics (etcd issue 21966), so the wait stops
// asking once the member's removal is under way: the member removed while
// its clients are held leaves the cluster and exits without a panic.
func TestHeldMemberRemovedWithoutAPanic(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 3)})
	leader, follower := leaderAndFollower(t, c)
	sc, _, _ := gatedSidecar(t, c, follower)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g.Eventually(func() error { return sc.Ready(ctx) }).WithTimeout(10 * time.Second).Should(Succeed())
	o := gateLock(t, sc)
	// The hold waits for the third member to lead, which never happens:
	// its wait asks for the follower's status until the hold ends.
	var until string
	for _, m := range c.MemberList(g) {
		if m.Name != follower.Name && m.Name != leader.Name {
			until = fmt.Sprintf("%x", m.ID)
		}
	}
	via := sidecar.NewClient(leader.SidecarURL, leader.ClientTLSConfig())
	// Each try begins a new hold, so the one in force at the removal has
	// most of its time left; etcd refuses the removal until every member
	// was connected for 5 s.
	retryWhile(g, sidecar.ReasonUnhealthyCluster, 30*time.Second, func() error {
		_ = sc.ReleaseClients(ctx, o)
		if _, err := sc.HoldClients(ctx, sidecar.ClientHold{Seconds: sidecar.MaxClientHold.Seconds(), UntilLeader: until}, o); err != nil {
			return StopTrying("holding the follower's clients").Wrap(err)
		}
		_, err := via.Remove(ctx, follower.Name, o)
		return err
	})
	g.Expect(c.MemberList(g)).NotTo(ContainElement(HaveField("Name", follower.Name)), "the follower was removed")
	g.Eventually(follower.Running).WithTimeout(15*time.Second).Should(BeFalse(), "etcd stops once it applied its own removal")
	log := follower.LogTail(-1)
	g.Expect(strings.Contains(log, "failed to find local ID")).To(BeFalse(), "the member panicked while it applied its own removal:\n%s", follower.LogTail(40))
	g.Expect(log).To(ContainSubstring("the member has been permanently removed from the cluster"))
}

// gateLock takes the membership lock through sc for a process of the
// holder controller-a and returns the lock headers its gate calls carry:
// only the lock's holder drains or holds a member's clients.
func gateLock(t *testing.T, sc *sidecar.Client) sidecar.CallOptions {
	t.Helper()
	o := sidecar.CallOptions{LockHolder: "controller-a", LockToken: lockToken(0)}
	if _, err := sc.AcquireLock(t.Context(), o.LockHolder, o.LockToken, time.Minute); err != nil {
		t.Fatalf("taking the membership lock: %v", err)
	}
	return o
}
