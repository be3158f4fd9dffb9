package sidecarcluster_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd/etcdtest"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// testCluster is a real etcd cluster with TLS and an in-process sidecar per
// member. Each sidecar's handler can be replaced by a fault.
type testCluster struct {
	*etcdtest.Cluster
	t *testing.T

	mu     sync.Mutex
	faults map[string]func(w http.ResponseWriter, r *http.Request) bool
}

// startCluster starts n members named prefix-0..n-1.
func startCluster(t *testing.T, prefix string, n int) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, faults: map[string]func(http.ResponseWriter, *http.Request) bool{}}
	tc.Cluster = etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered(prefix, n), Wrap: tc.faulty, ClientName: "membership-test"})
	return tc
}

// faulty serves m's sidecar s, behind the member's fault when one is set.
func (tc *testCluster) faulty(m *localetcd.Member, s *sidecar.Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tc.mu.Lock()
		fault := tc.faults[m.Name]
		tc.mu.Unlock()
		if fault != nil && fault(w, r) {
			return
		}
		s.ServeHTTP(w, r)
	})
}

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

func (tc *testCluster) endpoints() []sidecarcluster.Endpoint {
	var out []sidecarcluster.Endpoint
	for _, m := range tc.Members {
		out = append(out, sidecarcluster.Endpoint{Member: m.Name, URL: m.SidecarURL})
	}
	return out
}

func (tc *testCluster) newCluster(holder string, mutate ...func(*sidecarcluster.Config)) *sidecarcluster.Cluster {
	cfg := sidecarcluster.Config{Holder: holder, TLS: tc.ClientTLS, Logger: testr.New(tc.t)}
	for _, f := range mutate {
		f(&cfg)
	}
	c, err := sidecarcluster.New(cfg)
	if err != nil {
		tc.t.Fatalf("sidecarcluster.New: %v", err)
	}
	return c
}

// memberList is etcd's member list read directly: "name:learner|voter" and
// the IDs, to compare before and after.
func (tc *testCluster) memberList(g Gomega) []string {
	var out []string
	for _, m := range tc.MemberList(g) {
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

// replaceLeader prepares the move both execute and race tests make: a-0
// leads (so leadership must leave it first), and b-0, a new member not
// started yet, replaces it. It returns b-0, the sidecars including b-0's,
// and the target.
func (tc *testCluster) replaceLeader(ctx context.Context, g Gomega) (*localetcd.Member, []sidecarcluster.Endpoint, sidecarcluster.Target) {
	_, err := sidecar.NewClient(tc.Members[1].SidecarURL, tc.ClientTLS).MoveLeader(ctx, "a-0", sidecar.CallOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	b0, err := tc.Runtime.NewMember("b-0", localetcd.MemberOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	eps := append(tc.endpoints(), sidecarcluster.Endpoint{Member: "b-0", URL: b0.SidecarURL})
	return b0, eps, sidecarcluster.Target{
		Add: []planner.Want{
			{Name: "a-1", PeerURLs: []string{tc.Members[1].PeerURL}, Side: "a"},
			{Name: "a-2", PeerURLs: []string{tc.Members[2].PeerURL}, Side: "a"},
			{Name: "b-0", PeerURLs: []string{b0.PeerURL}, Side: "a"},
		},
		Remove: []string{"a-0"},
		Side:   func(string) string { return "a" },
	}
}
