package clientgate_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/druid-stretch/druid-stretch/internal/clientgate"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd/etcdtest"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// gated is a 3-member TLS cluster with a gate in front of each member's
// client port.
type gated struct {
	cluster *etcdtest.Cluster
	gates   map[string]*clientgate.Gate // by member name
	addrs   map[string]string           // gate URL by member name
}

func startGated(t testing.TB) *gated {
	t.Helper()
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 3)})
	serving, err := c.CA.Issue("gate", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := serving.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	serverTLS := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	g := &gated{cluster: c, gates: map[string]*clientgate.Gate{}, addrs: map[string]string{}}
	for _, m := range c.Members {
		g.gates[m.Name], g.addrs[m.Name] = serveGate(t, m, serverTLS, m.ClientTLSConfig())
	}
	return g
}

// serveGate runs a gate in front of m's client port until the test ends
// and returns it with its URL.
func serveGate(t testing.TB, m *localetcd.Member, serverTLS, backendTLS *tls.Config) (*clientgate.Gate, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	backend, err := url.Parse(m.LocalClientURL)
	if err != nil {
		t.Fatal(err)
	}
	gate, err := clientgate.New(clientgate.Options{Backend: backend, ServerTLS: serverTLS, BackendTLS: backendTLS})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gate.Serve(l) }()
	t.Cleanup(func() {
		_ = gate.Close()
		if err := <-served; err != nil {
			t.Errorf("gate of %s: %v", m.Name, err)
		}
	})
	return gate, "https://" + l.Addr().String()
}

// client is an etcd client of the gates, configured as kube-apiserver
// configures its own: the etcd client's defaults, so a write is retried
// only when it was never sent.
func (g *gated) client(t testing.TB, members ...string) *clientv3.Client {
	t.Helper()
	var eps []string
	for _, m := range members {
		eps = append(eps, g.addrs[m])
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: g.cluster.ClientTLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// direct is a client of one member's own client port, past its gate.
func direct(t testing.TB, m *localetcd.Member) *clientv3.Client {
	t.Helper()
	cli, err := m.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// writers put keys through cli until stopped, a few at a time, each write
// with a 10 s timeout and no retry of our own; they report every failed
// write and the slowest one. Readers (startReaders) do the same with
// linearizable reads.
type writers struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	writes  int
	failed  []string
	slowest time.Duration
	// failedFrom are the start times of the failed operations.
	failedFrom []time.Time
}

func startWriters(cli *clientv3.Client, n int) *writers {
	return startLoad(n, func(ctx context.Context, i, seq int) error {
		_, err := cli.Put(ctx, fmt.Sprintf("/gate/%d", i), fmt.Sprint(seq))
		return err
	})
}

func startReaders(cli *clientv3.Client, n int) *writers {
	return startLoad(n, func(ctx context.Context, i, _ int) error {
		_, err := cli.Get(ctx, fmt.Sprintf("/gate/%d", i))
		return err
	})
}

// startLoad runs op from n goroutines until finish.
func startLoad(n int, op func(ctx context.Context, i, seq int) error) *writers {
	w := &writers{stop: make(chan struct{})}
	for i := range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for seq := 0; ; seq++ {
				select {
				case <-w.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				err := op(ctx, i, seq)
				took := time.Since(start)
				cancel()
				w.mu.Lock()
				w.writes++
				w.slowest = max(w.slowest, took)
				if err != nil {
					w.failed = append(w.failed, err.Error())
					w.failedFrom = append(w.failedFrom, start)
				}
				w.mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	return w
}

func (w *writers) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes
}

func (w *writers) finish() (writes int, failed []string, slowest time.Duration) {
	close(w.stop)
	w.wg.Wait()
	return w.writes, w.failed, w.slowest
}

// failedSince are the failures of operations started at or after t.
func (w *writers) failedSince(t time.Time) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for i, at := range w.failedFrom {
		if !at.Before(t) {
			out = append(out, w.failed[i])
		}
	}
	return out
}

// grows waits until the writers completed n more writes.
func (w *writers) grows(g Gomega, n int) {
	from := w.count()
	g.Eventually(w.count).WithTimeout(30 * time.Second).WithPolling(10 * time.Millisecond).Should(BeNumerically(">=", from+n))
}

func leaderName(t testing.TB, g *gated) string {
	t.Helper()
	for _, m := range g.cluster.Members {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := direct(t, m).Status(ctx, m.ClientURL)
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return m.Name
		}
	}
	t.Fatal("no member says it is the leader")
	return ""
}

func memberID(t testing.TB, cli *clientv3.Client, name string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range resp.Members {
		if m.Name == name {
			return m.ID
		}
	}
	t.Fatalf("no member %s", name)
	return 0
}

// A member whose gate drained serves no client: removing it fails no
// write of a client that talked to every member, and the client's watch
// goes on elsewhere without missing a revision.
func TestDrainedMemberIsRemovedWithoutAFailedWrite(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := startGated(t)
	leader := leaderName(t, c)
	names := []string{"m-0", "m-1", "m-2"}
	victim := names[slices.IndexFunc(names, func(n string) bool { return n != leader })]
	cli := c.client(t, names...)

	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	var revs []int64
	var watchMu sync.Mutex
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for resp := range cli.Watch(clientv3.WithRequireLeader(watchCtx), "/gate/", clientv3.WithPrefix()) {
			watchMu.Lock()
			for _, ev := range resp.Events {
				revs = append(revs, ev.Kv.ModRevision)
			}
			watchMu.Unlock()
		}
	}()

	w := startWriters(cli, 6)
	w.grows(g, 200)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g.Expect(c.gates[victim].Drain(ctx)).To(Succeed())
	g.Expect(c.gates[victim].Ready()).To(BeFalse())
	g.Expect(c.gates[victim].InFlight()).To(BeZero())

	via := c.cluster.Runtime.Member(leader)
	id := memberID(t, direct(t, via), victim)
	// etcd refuses a removal until every member was connected for 5 s
	// (its strict reconfiguration check); the cluster is younger.
	g.Eventually(func() error {
		_, err := direct(t, via).MemberRemove(ctx, id)
		return err
	}).WithTimeout(15 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	w.grows(g, 200)
	writes, failed, slowest := w.finish()
	t.Logf("%d writes, slowest %s, failed: %v", writes, slowest, failed)
	g.Expect(failed).To(BeEmpty(), "no write failed while %s was drained and removed", victim)

	resp, err := direct(t, via).MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.Members).To(HaveLen(2), "the drained member is removed")

	// The watch saw every revision from its first event to the last write.
	last, err := direct(t, via).Get(ctx, "/gate/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() int64 {
		watchMu.Lock()
		defer watchMu.Unlock()
		if len(revs) == 0 {
			return 0
		}
		return revs[len(revs)-1]
	}).WithTimeout(20 * time.Second).Should(BeNumerically(">=", last.Kvs[0].ModRevision))
	stopWatch()
	<-watched
	for i := 1; i < len(revs); i++ {
		g.Expect(revs[i]).To(Equal(revs[i-1]+1), "the watch went on after the drain without a gap")
	}
}

// With every member's gate held, a leader transfer drops no proposal: the
// writes that would have been forwarded to the old leader wait at the
// gates instead, and none fails or hangs. The reads beside them, which a
// hold does not wait for, fail neither.
func TestHoldAroundLeaderTransferFailsNoWrite(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := startGated(t)
	names := []string{"m-0", "m-1", "m-2"}
	cli := c.client(t, names...)
	w := startWriters(cli, 6)
	r := startReaders(cli, 6)
	w.grows(g, 200)
	r.grows(g, 200)

	for round := range 3 {
		leader := leaderName(t, c)
		target := names[slices.IndexFunc(names, func(n string) bool { return n != leader })]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var releases []func()
		for _, gate := range c.gates {
			release, err := gate.Hold(ctx, 3*time.Second)
			g.Expect(err).NotTo(HaveOccurred())
			releases = append(releases, release)
		}
		via := direct(t, c.cluster.Runtime.Member(leader))
		_, err := via.MoveLeader(ctx, memberID(t, via, target))
		g.Expect(err).NotTo(HaveOccurred(), "round %d", round)
		for _, release := range releases {
			release()
		}
		cancel()
		g.Expect(leaderName(t, c)).To(Equal(target))
		w.grows(g, 100)
		r.grows(g, 100)
	}
	writes, failed, slowest := w.finish()
	t.Logf("%d writes, slowest %s, failed: %v", writes, slowest, failed)
	g.Expect(failed).To(BeEmpty(), "no write failed across three leader transfers")
	g.Expect(slowest).To(BeNumerically("<", 3*time.Second), "no write waited out a timeout")
	reads, failed, slowest := r.finish()
	t.Logf("%d reads, slowest %s, failed: %v", reads, slowest, failed)
	g.Expect(failed).To(BeEmpty(), "no read failed across three leader transfers")
	g.Expect(slowest).To(BeNumerically("<", 3*time.Second), "no read waited out a timeout")
}

// A hold ends by itself after its maximum, so a controller that dies in
// the middle of a transfer stalls clients for that long at most; it holds
// reads and proposals only.
func TestHoldEndsByItself(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := startGated(t)
	cli := c.client(t, "m-0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Timed from before the hold begins: the hold ends maxHold after a
	// moment after this one, so no write can be answered sooner, however
	// slowly a busy machine runs the calls before it.
	const maxHold = 2 * time.Second
	held := time.Now()
	_, err := c.gates["m-0"].Hold(ctx, maxHold)
	g.Expect(err).NotTo(HaveOccurred())
	// The controller's own calls pass a held gate: the leader transfer
	// and the status polls around it are neither reads nor proposals.
	_, err = cli.Status(ctx, c.addrs["m-0"])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(time.Since(held)).To(BeNumerically("<", maxHold), "a status call passes the hold")
	_, err = cli.Put(ctx, "/gate/held", "x")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(time.Since(held)).To(BeNumerically(">=", maxHold), "the write waited for the hold, which ended by itself")
}

// BenchmarkMembershipChangeUnderLoad prints, for a member removal and for
// a leader transfer under write load, the writes that failed and the
// slowest write without the gate's help (the baseline) and with it, all
// measured in the same run.
func BenchmarkMembershipChangeUnderLoad(b *testing.B) {
	for _, bc := range []struct {
		name   string
		change func(testing.TB, *gated, bool)
	}{
		{"removal", removeFollower},
		{"leader-transfer", transferLeader},
	} {
		for _, gateOn := range []bool{false, true} {
			name := bc.name + "/baseline"
			if gateOn {
				name = bc.name + "/gate"
			}
			b.Run(name, func(b *testing.B) {
				var failed, writes int
				var slowest time.Duration
				for range b.N {
					c := startGated(b)
					w := startWriters(c.client(b, "m-0", "m-1", "m-2"), 6)
					w.grows(NewWithT(b), 200)
					bc.change(b, c, gateOn)
					w.grows(NewWithT(b), 200)
					n, f, s := w.finish()
					writes, failed, slowest = writes+n, failed+len(f), max(slowest, s)
				}
				b.ReportMetric(float64(failed)/float64(b.N), "failed-writes/op")
				b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
				b.ReportMetric(slowest.Seconds(), "slowest-write-s")
			})
		}
	}
}

// BenchmarkDrain times a drain of a member whose clients have watches open
// through the gate, as kube-apiserver keeps one per watched resource, against
// a drain of one whose client has none (the baseline). A drain waits for
// the clients to leave after GOAWAY, up to closeGrace; a stream that does
// not end when the drain ends it holds the connection for all of that.
// With clients>1 each client is a connection of its own, with writers, as
// kube-apiserver opens several etcd clients: they leave one after the
// other, and the drain ends when the last one has.
func BenchmarkDrain(b *testing.B) {
	for _, bc := range []struct{ clients, watches int }{{1, 0}, {1, 56}, {24, 56}} {
		b.Run(fmt.Sprintf("clients=%d/watches=%d", bc.clients, bc.watches), func(b *testing.B) {
			var took time.Duration
			for range b.N {
				b.StopTimer()
				c := startGated(b)
				victim := "m-0"
				ctx, cancel := context.WithCancel(context.Background())
				var writers sync.WaitGroup
				for i := range bc.clients {
					cli := c.client(b, victim)
					for j := i; j < bc.watches; j += bc.clients {
						wc := cli.Watch(clientv3.WithRequireLeader(ctx), fmt.Sprintf("/drain/%d/", j), clientv3.WithPrefix())
						go func() {
							for range wc { // until the client closes
							}
						}()
					}
					// A write through the gate: the connection is up, and a
					// watch created before it is registered.
					if _, err := cli.Put(ctx, "/drain/ready", "1"); err != nil {
						b.Fatal(err)
					}
					if bc.clients > 1 {
						writers.Go(func() {
							for ctx.Err() == nil {
								_, _ = cli.Put(ctx, fmt.Sprintf("/drain/w/%d", i), "1")
							}
						})
					}
				}
				b.StartTimer()
				start := time.Now()
				if err := c.gates[victim].Drain(ctx); err != nil {
					b.Fatal(err)
				}
				took += time.Since(start)
				b.StopTimer()
				cancel()
				writers.Wait()
			}
			b.ReportMetric(took.Seconds()/float64(b.N), "drain-s/op")
		})
	}
}

// removeFollower removes a follower, after draining its gate when gateOn.
func removeFollower(t testing.TB, c *gated, gateOn bool) {
	leader := leaderName(t, c)
	victim := "m-0"
	if leader == victim {
		victim = "m-1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if gateOn {
		if err := c.gates[victim].Drain(ctx); err != nil {
			t.Fatal(err)
		}
	}
	via := direct(t, c.cluster.Runtime.Member(leader))
	id := memberID(t, via, victim)
	NewWithT(t).Eventually(func() error {
		_, err := via.MemberRemove(ctx, id)
		return err
	}).WithTimeout(15 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
}

// transferLeader moves leadership to a follower, with every gate held
// around it when gateOn.
func transferLeader(t testing.TB, c *gated, gateOn bool) {
	leader := leaderName(t, c)
	target := "m-0"
	if leader == target {
		target = "m-1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if gateOn {
		for _, gate := range c.gates {
			release, err := gate.Hold(ctx, 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
		}
	}
	via := direct(t, c.cluster.Runtime.Member(leader))
	if _, err := via.MoveLeader(ctx, memberID(t, via, target)); err != nil {
		t.Fatal(err)
	}
}

// A gate whose member does not serve takes no connection: etcd's client
// is refused, as by the member itself, instead of being accepted and
// failed call after call.
func TestGateOfAMemberThatIsDownRefusesConnections(t *testing.T) {
	g := NewWithT(t)
	down, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	backend, err := url.Parse("http://" + down.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(down.Close()).To(Succeed())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	gate, err := clientgate.New(clientgate.Options{Backend: backend})
	g.Expect(err).NotTo(HaveOccurred())
	served := make(chan error, 1)
	go func() { served <- gate.Serve(l) }()
	defer func() {
		_ = gate.Close()
		if err := <-served; err != nil {
			t.Errorf("the gate's Serve after Close: %v", err)
		}
	}()
	g.Eventually(func() error {
		c, err := net.Dial("tcp", l.Addr().String())
		if err == nil {
			_ = c.Close()
		}
		return err
	}).WithTimeout(5 * time.Second).Should(MatchError(syscall.ECONNREFUSED))
	g.Consistently(gate.Serving).WithTimeout(500 * time.Millisecond).Should(BeFalse())
}

// A member whose etcd stops (a deleted pod: SIGTERM) or crashes (SIGKILL)
// fails no write of a client of every gate: its gate stops listening, and
// a call that reaches it once the member is gone is answered so that
// etcd's client sends it to another member. With SIGKILL the writes in
// flight at the member when it died are lost with it, as without a gate
// (whether etcd applied them is unknown, so no one may send them again):
// only the writes begun after its death count. Once the member is back,
// its gate serves again.
func TestMemberThatStopsFailsNoWrite(t *testing.T) {
	testbin.Need(t)
	for _, tc := range []struct {
		name string
		stop func(*localetcd.Member) error
		// all: every write counts, also those in flight at the stop.
		all bool
	}{
		{"SIGTERM", func(m *localetcd.Member) error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return m.Stop(ctx)
		}, true},
		{"SIGKILL", (*localetcd.Member).Kill, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			c := startGated(t)
			leader := leaderName(t, c)
			names := []string{"m-0", "m-1", "m-2"}
			// A follower: a leader's end loses the proposals forwarded to
			// it, whatever is in front of its client port.
			victim := names[slices.IndexFunc(names, func(n string) bool { return n != leader })]
			cli := c.client(t, names...)
			w := startWriters(cli, 6)
			w.grows(g, 300)

			m := c.cluster.Runtime.Member(victim)
			g.Expect(tc.stop(m)).To(Succeed())
			dead := time.Now()
			w.grows(g, 300)
			if tc.all {
				g.Expect(w.failedSince(time.Time{})).To(BeEmpty(), "no write failed while %s stopped", victim)
			} else {
				g.Expect(w.failedSince(dead)).To(BeEmpty(), "no write begun after %s died failed", victim)
			}
			g.Eventually(c.gates[victim].Serving).WithTimeout(5*time.Second).Should(BeFalse(), "the gate of a member that is gone does not listen")
			u, err := url.Parse(c.addrs[victim])
			g.Expect(err).NotTo(HaveOccurred())
			_, err = net.Dial("tcp", u.Host)
			g.Expect(err).To(MatchError(syscall.ECONNREFUSED))

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			g.Expect(m.Restart(ctx)).To(Succeed())
			g.Eventually(c.gates[victim].Serving).WithTimeout(10*time.Second).Should(BeTrue(), "the gate listens again once its member serves")
			_, err = c.client(t, victim).Put(ctx, "/gate/back", "1")
			g.Expect(err).NotTo(HaveOccurred(), "the member's own gate serves again")
			w.grows(g, 300)

			writes, failed, slowest := w.finish()
			t.Logf("%d writes, slowest %s, failed: %v", writes, slowest, failed)
			if tc.all {
				g.Expect(failed).To(BeEmpty(), "no write failed while %s stopped and came back", victim)
			} else {
				g.Expect(w.failedSince(dead)).To(BeEmpty(), "no write begun after %s died failed", victim)
			}
		})
	}
}

// A drain that is undone lets the clients back: the gate listens again
// and serves writes, as before the drain.
func TestUndrainedGateServesAgain(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := startGated(t)
	cli := c.client(t, "m-0", "m-1", "m-2")
	w := startWriters(cli, 3)
	w.grows(g, 100)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gate := c.gates["m-0"]
	g.Expect(gate.Drain(ctx)).To(Succeed())
	g.Expect(gate.Ready()).To(BeFalse())
	u, err := url.Parse(c.addrs["m-0"])
	g.Expect(err).NotTo(HaveOccurred())
	_, err = net.Dial("tcp", u.Host)
	g.Expect(err).To(MatchError(syscall.ECONNREFUSED), "a drained gate takes no connection")
	w.grows(g, 100)

	gate.Undrain()
	g.Expect(gate.Ready()).To(BeTrue())
	g.Eventually(gate.Serving).WithTimeout(5 * time.Second).Should(BeTrue())
	_, err = c.client(t, "m-0").Put(ctx, "/gate/undrained", "1")
	g.Expect(err).NotTo(HaveOccurred(), "the undrained gate serves writes")
	// And a drain after it works as the first did.
	g.Expect(gate.Drain(ctx)).To(Succeed())
	_, err = net.Dial("tcp", u.Host)
	g.Expect(err).To(MatchError(syscall.ECONNREFUSED))
	w.grows(g, 100)
	writes, failed, _ := w.finish()
	t.Logf("%d writes, failed: %v", writes, failed)
	g.Expect(failed).To(BeEmpty())
}

// etcd's own errors reach the client through the gate as etcd sent them:
// a read of a compacted revision is etcd's ErrCompacted, which
// kube-apiserver's watch cache relies on.
func TestEtcdErrorsPassThrough(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	c := startGated(t)
	cli := c.client(t, "m-0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := cli.Put(ctx, "/gate/compacted", "1")
	g.Expect(err).NotTo(HaveOccurred())
	last, err := cli.Put(ctx, "/gate/compacted", "2")
	g.Expect(err).NotTo(HaveOccurred())
	_, err = cli.Compact(ctx, last.Header.Revision)
	g.Expect(err).NotTo(HaveOccurred())
	// etcd answers an error before any message "trailers-only" (the
	// status in the headers that end the stream); many calls, so that a
	// proxy that split those headers from the stream's end even once
	// would show.
	for range 300 {
		_, err = cli.Get(ctx, "/gate/compacted", clientv3.WithRev(first.Header.Revision))
		g.Expect(err).To(MatchError(rpctypes.ErrCompacted))
	}
}
