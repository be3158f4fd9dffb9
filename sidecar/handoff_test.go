package sidecar_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd/etcdtest"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestLeaderHandsOverBeforeItsEtcdStops ends a leader's pod as kubelet does
// with druid-stretch's webhook: the sidecar first (its SIGTERM), etcd
// after. Writers go through every member's gate all along. The leader's
// sidecar hands leadership over with the other two gates held (both
// acknowledge their hold), so that the leader's own stop has no transfer
// left to make ("skipped leadership transfer" in its log) and no write
// fails: neither a forwarded proposal dropped during a transfer nor a call
// cut by the stop. A follower's sidecar has nothing to hand over.
func TestLeaderHandsOverBeforeItsEtcdStops(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 3)})
	servers := map[string]*sidecar.Server{}
	var urls []string
	for _, m := range c.Members {
		_, srv, _, gateURL := gatedServer(t, c, m)
		servers[m.Name] = srv
		urls = append(urls, gateURL)
	}
	leader, follower := leaderAndFollower(t, c)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	h, err := servers[follower.Name].HandOffLeadership(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(h).To(BeNil(), "a follower has no leadership to hand over")

	cli, err := clientv3.New(clientv3.Config{Endpoints: urls, TLS: c.ClientTLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	w := writeThrough(ctx, cli, 6)
	w.waitFor(g, 300)

	h, err = servers[leader.Name].HandOffLeadership(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(h).NotTo(BeNil())
	t.Logf("handoff: %+v", *h)
	g.Expect(h.From).To(Equal(leader.Name))
	g.Expect(h.To).NotTo(Equal(leader.Name))
	g.Expect(h.Voters).To(Equal(2))
	g.Expect(h.Held).To(Equal(2), "both other gates held their clients before the transfer")
	st, err := cli.Status(ctx, c.Members[0].ClientURL)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fmt.Sprintf("%x", st.Leader)).NotTo(Equal(memberIDOf(ctx, g, cli, leader.Name)), "leadership moved")
	w.waitFor(g, 300)

	g.Expect(leader.Stop(ctx)).To(Succeed())
	log, err := os.ReadFile(leader.LogPath)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(log)).To(ContainSubstring("skipped leadership transfer"), "the stopped member no longer led")
	w.waitFor(g, 300)
	writes, failed := w.stop()
	t.Logf("%d writes through the gates, failed: %v", writes, failed)
	g.Expect(failed).To(BeEmpty())
}

// TestHandoffPassesOverADrainedMember: the controller drained a follower's
// clients for its removal, and the leader's pod ends before the removal.
// The leader's sidecar hands leadership to the other follower, not to the
// drained one that the default order (the lowest name) would choose:
// that member would only have to hand it on again before its removal.
// Undoing the drain takes its mark away.
func TestHandoffPassesOverADrainedMember(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 3)})
	clients := map[string]*sidecar.Client{}
	servers := map[string]*sidecar.Server{}
	for _, m := range c.Members {
		sc, srv, _, _ := gatedServer(t, c, m)
		clients[m.Name], servers[m.Name] = sc, srv
	}
	leader, _ := leaderAndFollower(t, c)
	var drained, other string
	for _, m := range c.Members { // by name: the default order's first
		switch {
		case m == leader:
		case drained == "":
			drained = m.Name
		default:
			other = m.Name
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cli := etcdClientT(t, c, leader.ClientURL)
	drainedID := memberIDOf(ctx, g, cli, drained)
	mark := "/druid-stretch/drained/" + drainedID
	g.Eventually(func() error { return clients[drained].Ready(ctx) }).WithTimeout(10*time.Second).Should(Succeed(), "the sidecar learned its member")
	o := gateLock(t, clients[drained])
	_, err := clients[drained].DrainClients(ctx, sidecar.ClientDrain{Seconds: 30}, o)
	g.Expect(err).NotTo(HaveOccurred())
	resp, err := cli.Get(ctx, mark)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.Kvs).To(HaveLen(1), "the drain is marked in etcd")

	h, err := servers[leader.Name].HandOffLeadership(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(h).NotTo(BeNil())
	g.Expect(h.To).To(Equal(other), "the drained %s was passed over", drained)
	st, err := cli.Status(ctx, leader.ClientURL)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fmt.Sprintf("%x", st.Leader)).To(Equal(memberIDOf(ctx, g, cli, other)), "etcd's leader is the successor")

	_, err = clients[drained].UndrainClients(ctx, o)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() ([]*mvccpb.KeyValue, error) {
		resp, err := cli.Get(ctx, mark)
		if err != nil {
			return nil, err
		}
		return resp.Kvs, nil
	}).WithTimeout(10*time.Second).Should(BeEmpty(), "the undone drain's mark is gone")
}

// memberIDOf is the named member's ID in hex.
func memberIDOf(ctx context.Context, g Gomega, cli *clientv3.Client, name string) string {
	resp, err := cli.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	for _, m := range resp.Members {
		if m.Name == name {
			return fmt.Sprintf("%x", m.ID)
		}
	}
	return ""
}

// writers put keys through an etcd client until stopped, each write with
// etcd's own request timeout, and keep every failure.
type writers struct {
	mu     sync.Mutex
	writes int
	failed []string
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func writeThrough(ctx context.Context, cli *clientv3.Client, n int) *writers {
	ctx, cancel := context.WithCancel(ctx)
	w := &writers{cancel: cancel}
	for i := range n {
		w.done.Add(1)
		go func() {
			defer w.done.Done()
			for j := 0; ctx.Err() == nil; j++ {
				_, err := cli.Put(ctx, fmt.Sprintf("/handoff/%d/%d", i, j), "x")
				w.mu.Lock()
				switch {
				case err == nil:
					w.writes++
				case ctx.Err() == nil:
					w.failed = append(w.failed, err.Error())
				}
				w.mu.Unlock()
			}
		}()
	}
	return w
}

// waitFor returns once n more writes succeeded.
func (w *writers) waitFor(g Gomega, n int) {
	w.mu.Lock()
	want := w.writes + n
	w.mu.Unlock()
	g.Eventually(func() int { w.mu.Lock(); defer w.mu.Unlock(); return w.writes }).WithTimeout(30 * time.Second).Should(BeNumerically(">=", want))
}

func (w *writers) stop() (int, []string) {
	w.cancel()
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes, append([]string(nil), w.failed...)
}
