package membership_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/membership"
	"github.com/druid-stretch/druid-stretch/internal/pki"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// testCluster is a real etcd cluster with TLS and an in-process sidecar per
// member. Each sidecar's handler can be replaced by a fault.
type testCluster struct {
	t         *testing.T
	r         *localetcd.Runtime
	ca        *pki.CA
	members   []*localetcd.Member
	clientTLS *tls.Config

	mu     sync.Mutex
	faults map[string]func(w http.ResponseWriter, r *http.Request) bool
}

// startCluster starts n members named prefix-0..n-1.
func startCluster(t *testing.T, prefix string, n int) *testCluster {
	t.Helper()
	ca, err := pki.NewCA("membership-test-ca")
	if err != nil {
		t.Fatalf("creating the CA: %v", err)
	}
	tc := &testCluster{t: t, ca: ca, faults: map[string]func(http.ResponseWriter, *http.Request) bool{}}
	log := testr.NewWithOptions(t, testr.Options{LogTimestamp: true, Verbosity: 0})
	tc.r, err = localetcd.New(localetcd.Options{Dir: t.TempDir(), CA: ca, Logger: log, Sidecar: tc.newSidecar})
	if err != nil {
		t.Fatalf("localetcd.New: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range tc.r.Members() {
				t.Logf("log tail of %s:\n%s", m.Name, m.LogTail(15))
			}
		}
		if err := tc.r.Close(); err != nil {
			t.Errorf("closing the runtime: %v", err)
		}
	})
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if tc.members, err = tc.r.StartCluster(ctx, names, localetcd.MemberOptions{}); err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	pair, err := ca.Issue("membership-test", "localhost")
	if err != nil {
		t.Fatalf("issuing the client certificate: %v", err)
	}
	if tc.clientTLS, err = ca.ClientConfig(&pair); err != nil {
		t.Fatalf("client TLS: %v", err)
	}
	return tc
}

// newSidecar serves a real sidecar, behind the member's fault when one is set.
func (tc *testCluster) newSidecar(m *localetcd.Member) (http.Handler, error) {
	eps := []string{m.LocalClientURL}
	for _, o := range tc.r.Members() {
		if o != m && o.Running() {
			eps = append(eps, o.ClientURL)
		}
	}
	s, err := sidecar.New(sidecar.Config{Endpoints: eps, EtcdTLS: m.ClientTLSConfig(), Registry: prometheus.NewRegistry()})
	if err != nil {
		return nil, err
	}
	return closer{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tc.mu.Lock()
		fault := tc.faults[m.Name]
		tc.mu.Unlock()
		if fault != nil && fault(w, r) {
			return
		}
		s.ServeHTTP(w, r)
	}), close: s.Close}, nil
}

type closer struct {
	http.Handler
	close func() error
}

func (c closer) Close() error { return c.close() }

// fault makes m's sidecar answer with f (when f returns true) instead.
func (tc *testCluster) fault(m *localetcd.Member, f func(w http.ResponseWriter, r *http.Request) bool) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if f == nil {
		delete(tc.faults, m.Name)
		return
	}
	tc.faults[m.Name] = f
}

func (tc *testCluster) endpoints() []membership.Endpoint {
	var out []membership.Endpoint
	for _, m := range tc.members {
		out = append(out, membership.Endpoint{Member: m.Name, URL: m.SidecarURL})
	}
	return out
}

func (tc *testCluster) newCluster(holder string, mutate ...func(*membership.Config)) *membership.Cluster {
	cfg := membership.Config{Holder: holder, TLS: tc.clientTLS, Logger: testr.New(tc.t)}
	for _, f := range mutate {
		f(&cfg)
	}
	c, err := membership.New(cfg)
	if err != nil {
		tc.t.Fatalf("membership.New: %v", err)
	}
	return c
}

// memberList is etcd's member list read directly: "name:learner|voter" and
// the IDs, to compare before and after.
func (tc *testCluster) memberList(g Gomega) []string {
	var eps []string
	for _, m := range tc.r.Members() {
		if m.Running() {
			eps = append(eps, m.ClientURL)
		}
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: tc.members[0].ClientTLSConfig(), DialTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	var out []string
	for _, m := range resp.Members {
		role := "voter"
		if m.IsLearner {
			role = "learner"
		}
		out = append(out, fmt.Sprintf("%x:%s:%s", m.ID, m.Name, role))
	}
	return out
}

// answer writes a sidecar-style error.
func answer(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body))
}

func isMutating(r *http.Request) bool { return r.Method != http.MethodGet }
