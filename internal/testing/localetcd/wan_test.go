package localetcd

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/druid-stretch/druid-stretch/internal/testing/linkemu"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// TestWAN: two members in site a and one in site b, 90 ms one-way apart,
// with TLS, form a cluster; peer traffic really crosses the emulated WAN
// (a write through b takes at least one round trip, and a partition cuts
// b off until it heals).
func TestWAN(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	const oneWay = 90 * time.Millisecond
	wan := linkemu.NewWAN()
	t.Cleanup(func() { _ = wan.Close() })
	wan.SetDelay("a", "b", oneWay)
	ca, err := pki.NewCA("localetcd-wan-test")
	g.Expect(err).NotTo(HaveOccurred())
	r := newRuntime(t, Options{CA: ca, WAN: wan, HeartbeatInterval: 200 * time.Millisecond, ElectionTimeout: 2 * time.Second})
	ctx := testContext(t, 2*time.Minute)

	_, err = r.NewMember("nowhere", MemberOptions{})
	g.Expect(err).To(MatchError(ContainSubstring(`member "nowhere" needs a Site when the runtime has a WAN`)))

	var ms []*Member
	for _, s := range []struct{ name, site string }{{"a1", "a"}, {"a2", "a"}, {"b1", "b"}} {
		m, err := r.NewMember(s.name, MemberOptions{Site: s.site})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(m.PeerURL).NotTo(Equal(m.LocalPeerURL), "peers reach each other through the fronts")
		g.Expect(m.ClientURL).NotTo(Equal(m.LocalClientURL))
		ms = append(ms, m)
	}
	g.Expect(r.StartMembers(ctx, ms...)).To(Succeed())
	c := client(t, ms[0])
	g.Expect(memberList(ctx, g, c)).To(Equal([]memberView{{"a1", false}, {"a2", false}, {"b1", false}}))
	resp, err := c.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	for _, pm := range resp.Members {
		m := r.Member(pm.Name)
		g.Expect(pm.PeerURLs).To(Equal([]string{m.PeerURL}))
		g.Expect(pm.ClientURLs).To(Equal([]string{m.ClientURL}))
	}

	// Straight to b1's own client port, so the only WAN on the way is the
	// peers': whoever leads, the write needs a round trip between sites.
	b1 := localClient(t, ms[2])
	for i := range 3 {
		start := time.Now()
		_, err := b1.Put(ctx, "via-b", "x")
		took := time.Since(start)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(took).To(BeNumerically(">=", 2*oneWay), "write %d through b1", i)
		t.Logf("write through b1: %v", took)
	}

	// Cut b off: b1 loses the cluster; after the heal it serves again.
	wan.Partition("a", "b")
	g.Eventually(func() error {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := b1.Get(actx, "via-b")
		return err
	}).WithContext(ctx).WithTimeout(20 * time.Second).Should(HaveOccurred())
	// a1 and a2 keep a quorum; if b1 led, they first elect a new leader.
	g.Eventually(func() error {
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := c.Put(actx, "during-partition", "a-side")
		return err
	}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
	wan.Heal("a", "b")
	g.Expect(ms[2].WaitReady(ctx)).To(Succeed())
	g.Eventually(func(g Gomega) {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		got, err := b1.Get(actx, "during-partition")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got.Kvs).To(HaveLen(1))
	}).WithContext(ctx).WithTimeout(20 * time.Second).Should(Succeed())
}

// localClient talks to a member's own client port, bypassing the WAN.
func localClient(t *testing.T, m *Member) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{m.LocalClientURL}, TLS: m.ClientTLSConfig(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
