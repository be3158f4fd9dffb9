package etcdwrapper

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zaptest"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

func readyzStatus(url string) func() (int, error) {
	return func() (int, error) {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
}

// The poller starts before etcd, as in Run: /readyz is 503 until a
// linearizable read succeeds, 200 while etcd serves, 503 again once it
// stops.
func TestReadinessFollowsRealEtcd(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	log := zaptest.NewLogger(t)
	m := newLoopbackMember(t, "m0", "http")
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{m.clientURL}, DialTimeout: etcdDialTimeout, Logger: log})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = client.Close() }()

	r := &readiness{}
	srv := httptest.NewServer(r)
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.poll(ctx, client, 20*time.Millisecond, log)
	}()
	defer func() {
		cancel()
		<-done
	}()
	g.Expect(readyzStatus(srv.URL)()).To(Equal(http.StatusServiceUnavailable))

	stop := startEmbedded(t, m, m.initialClusterEntry, "new")
	g.Eventually(readyzStatus(srv.URL), 30*time.Second, 20*time.Millisecond).Should(Equal(http.StatusOK))

	stop()
	g.Eventually(readyzStatus(srv.URL), 30*time.Second, 20*time.Millisecond).Should(Equal(http.StatusServiceUnavailable))
}

// A learner serves only serializable reads, so the real wrapper's
// linearizable check keeps it unready until it is promoted.
func TestReadinessLearnerIsNotReadyUntilPromoted(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	log := zaptest.NewLogger(t)
	m0, m1 := newLoopbackMember(t, "m0", "http"), newLoopbackMember(t, "m1", "http")
	startEmbedded(t, m0, m0.initialClusterEntry, "new")
	c0, err := clientv3.New(clientv3.Config{Endpoints: []string{m0.clientURL}, DialTimeout: etcdDialTimeout, Logger: log})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = c0.Close() }()
	g.Eventually(func() error { return check(context.Background(), c0) }, 30*time.Second).Should(Succeed())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	added, err := c0.MemberAddAsLearner(ctx, []string{m1.peerURL})
	g.Expect(err).NotTo(HaveOccurred())
	startEmbedded(t, m1, m0.initialClusterEntry+","+m1.initialClusterEntry, "existing")
	c1, err := clientv3.New(clientv3.Config{Endpoints: []string{m1.clientURL}, DialTimeout: etcdDialTimeout, Logger: log})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = c1.Close() }()

	// The learner serves: a serializable read succeeds, the check fails.
	g.Eventually(func() error {
		_, err := c1.Get(context.Background(), readinessKey, clientv3.WithSerializable())
		return err
	}, 30*time.Second).Should(Succeed())
	g.Expect(check(context.Background(), c1)).To(MatchError(ContainSubstring("not supported for learner")))

	// Promotion succeeds once the learner has caught up.
	g.Eventually(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c0.MemberPromote(ctx, added.Member.ID)
		return err
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
	g.Eventually(func() error { return check(context.Background(), c1) }, 30*time.Second).Should(Succeed())
}

func TestReadinessHandler(t *testing.T) {
	g := NewWithT(t)
	r := &readiness{}
	for _, ready := range []bool{false, true} {
		r.ready.Store(ready)
		for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost} {
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(method, "/readyz", nil))
			want := http.StatusServiceUnavailable
			if ready {
				want = http.StatusOK
			}
			g.Expect(w.Code).To(Equal(want), "ready=%v %s", ready, method)
			g.Expect(w.Body.Len()).To(BeZero())
		}
	}
}
