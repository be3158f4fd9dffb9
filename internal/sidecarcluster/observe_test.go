package sidecarcluster_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestObserveFallsBackAndPrefers asks a dead sidecar, a hanging one and the
// real ones: the first real answer wins, the hanging one costs the stagger
// and not its timeout, failures are named, and the next observation starts
// with the sidecars that answered.
func TestObserveFallsBackAndPrefers(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, "obs", 3)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	dead := deadURL(t)
	hanging := hangingURL(t)
	c := tc.newCluster("observer", func(cfg *sidecarcluster.Config) {
		cfg.ObserveStagger = 300 * time.Millisecond
		cfg.ObserveTimeout = 20 * time.Second
	})
	eps := append([]sidecarcluster.Endpoint{{Member: "gone", URL: dead}, {Member: "stuck", URL: hanging}}, tc.endpoints()...)

	start := time.Now()
	obs, err := c.Observe(ctx, eps, sidecarcluster.Hint{Departing: []string{"obs-0"}})
	took := time.Since(start)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.Via.Member).To(Equal("obs-1"), "obs-0 is departing, so obs-1 is the first real sidecar")
	g.Expect(took).To(BeNumerically("<", 5*time.Second), "the hanging sidecar must not hold the observation for its 20 s timeout")
	g.Expect(obs.List.Members).To(HaveLen(3))
	g.Expect(obs.Failures).To(HaveLen(1))
	g.Expect(obs.Failures[0].Endpoint.Member).To(Equal("gone"))
	g.Expect(obs.Failures[0].Error()).To(ContainSubstring("connection refused"))

	// Both failed recently, so they go last now; healthy members go first.
	obs, err = c.Observe(ctx, eps, sidecarcluster.Hint{Healthy: []string{"obs-2"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.Via.Member).To(Equal("obs-2"))
	g.Expect(obs.Failures).To(BeEmpty())

	// A learner's sidecar goes after the others: it cannot tell how long
	// the voters have had a learner connected.
	obs, err = c.Observe(ctx, tc.endpoints(), sidecarcluster.Hint{Learners: []string{"obs-0"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.Via.Member).To(Equal("obs-1"))

	// The leader's sidecar goes first, departing or not: changes go to it.
	obs, err = c.Observe(ctx, tc.endpoints(), sidecarcluster.Hint{Healthy: []string{"obs-0", "obs-2"}, Departing: []string{"obs-2"}, Leader: "obs-2"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.Via.Member).To(Equal("obs-2"))
	// Unless it failed lately.
	obs, err = c.Observe(ctx, eps, sidecarcluster.Hint{Healthy: []string{"obs-1"}, Leader: "gone"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.Via.Member).To(Equal("obs-1"))
	g.Expect(obs.Failures).To(BeEmpty(), "the dead leader's sidecar was not asked first")
}

// TestObserveRefusesASidecarOfAnotherMember: both seeds of a GEP-39 move
// run the Etcd under one name, so a pod's in-cluster name can lead to the
// other seed's pod of that name. A sidecar that answers for another member
// than the endpoint's is not taken as that member's: the observation goes
// on with the next sidecar, and the failure names both members.
func TestObserveRefusesASidecarOfAnotherMember(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, "who", 3)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	eps := tc.endpoints()
	// A sidecar names the member whose transport it reads once it has
	// polled that member's metrics.
	g.Eventually(func(g Gomega) {
		l, err := sidecar.NewClient(eps[0].URL, tc.ClientTLS).Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l.TransportOf).NotTo(BeEmpty())
	}).WithContext(ctx).WithPolling(100 * time.Millisecond).Should(Succeed())

	c := tc.newCluster("observer")
	// who-1's endpoint leads to who-0's sidecar.
	misrouted := []sidecarcluster.Endpoint{{Member: eps[1].Member, URL: eps[0].URL}, eps[2]}
	obs, err := c.Observe(ctx, misrouted, sidecarcluster.Hint{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.Via.Member).To(Equal(eps[2].Member))
	g.Expect(obs.Failures).To(HaveLen(1))
	g.Expect(obs.Failures[0].Error()).To(ContainSubstring("answers for member " + eps[0].Member + ", not for " + eps[1].Member))

	// The same sidecar as its own member's endpoint answers.
	obs, err = c.Observe(ctx, eps[:1], sidecarcluster.Hint{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(obs.Via.Member).To(Equal(eps[0].Member))
	g.Expect(obs.Failures).To(BeEmpty())
}

// TestObserveNamesEverySidecarWhenNoneAnswers checks the error of an
// unreachable cluster: every sidecar with its cause.
func TestObserveNamesEverySidecarWhenNoneAnswers(t *testing.T) {
	g := NewWithT(t)
	c, err := sidecarcluster.New(sidecarcluster.Config{Holder: "observer", ObserveTimeout: 300 * time.Millisecond, ObserveStagger: 100 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	dead, hanging := deadURL(t), hangingURL(t)
	_, err = c.Observe(t.Context(), []sidecarcluster.Endpoint{{Member: "a", URL: dead}, {Member: "b", URL: hanging}}, sidecarcluster.Hint{})
	var u *sidecarcluster.UnreachableError
	g.Expect(errors.As(err, &u)).To(BeTrue(), "got %v", err)
	g.Expect(u.Failures).To(HaveLen(2))
	g.Expect(err.Error()).To(And(ContainSubstring("a ("+dead+")"), ContainSubstring("connection refused"),
		ContainSubstring("b ("+hanging+")"), ContainSubstring("deadline exceeded")))

	_, err = c.Observe(t.Context(), nil, sidecarcluster.Hint{})
	g.Expect(err).To(MatchError(ContainSubstring("endpoint list is empty")))
}

func TestNewRefusesBadHolder(t *testing.T) {
	for _, holder := range []string{"", "a/b", "seed a"} {
		_, err := sidecarcluster.New(sidecarcluster.Config{Holder: holder})
		NewWithT(t).Expect(err).To(HaveOccurred(), "holder %q", holder)
	}
}

// deadURL is an https URL on a port nobody listens on.
func deadURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return "https://" + addr
}

// hangingURL accepts connections (the kernel does) but never answers, like
// a pod whose sidecar port is reserved but not served yet.
func hangingURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return "https://" + l.Addr().String()
}
