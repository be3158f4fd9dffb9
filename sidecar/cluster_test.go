package sidecar_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/linkemu"
	"github.com/druid-stretch/druid-stretch/internal/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/pki"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// testCluster is a real etcd cluster with TLS, each member with a sidecar
// served over HTTPS by the local member runtime.
type testCluster struct {
	t       testing.TB
	r       *localetcd.Runtime
	ca      *pki.CA
	wan     *linkemu.WAN
	members []*localetcd.Member

	mu       sync.Mutex
	sidecars map[string]*sidecar.Server
}

type clusterOptions struct {
	// sites places the initial members one per site behind a WAN; nil for
	// no WAN.
	sites []string
	// oneWay is the delay between every two sites (half the RTT).
	oneWay              time.Duration
	heartbeat, election time.Duration
	// logger receives the sidecars' and the runtime's logs (default testr).
	logger logr.Logger
}

func startCluster(t testing.TB, n int, o clusterOptions) *testCluster {
	t.Helper()
	ca, err := pki.NewCA("sidecar-test-ca")
	if err != nil {
		t.Fatalf("creating the CA: %v", err)
	}
	tc := &testCluster{t: t, ca: ca, sidecars: map[string]*sidecar.Server{}}
	if o.logger.GetSink() == nil {
		o.logger = testr.NewWithInterface(t, testr.Options{LogTimestamp: true})
	}
	opts := localetcd.Options{
		Dir:               t.TempDir(),
		CA:                ca,
		HeartbeatInterval: o.heartbeat,
		ElectionTimeout:   o.election,
		Logger:            o.logger,
		Sidecar:           tc.newSidecar(o.logger),
	}
	if o.sites != nil {
		tc.wan = linkemu.NewWAN()
		opts.WAN = tc.wan
		for i, a := range o.sites {
			for _, b := range o.sites[i+1:] {
				tc.wan.SetDelay(a, b, o.oneWay)
			}
		}
	}
	if tc.r, err = localetcd.New(opts); err != nil {
		t.Fatalf("localetcd.New: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range tc.r.Members() {
				t.Logf("log tail of %s:\n%s", m.Name, m.LogTail(20))
			}
		}
		if err := tc.r.Close(); err != nil {
			t.Errorf("closing the runtime: %v", err)
		}
		if tc.wan != nil {
			_ = tc.wan.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range n {
		var site string
		if o.sites != nil {
			site = o.sites[i]
		}
		m, err := tc.r.NewMember(fmt.Sprintf("etcd-%d", i), localetcd.MemberOptions{Site: site})
		if err != nil {
			t.Fatalf("NewMember: %v", err)
		}
		tc.members = append(tc.members, m)
	}
	if err := tc.r.StartMembers(ctx, tc.members...); err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	return tc
}

// newSidecar builds each member's sidecar as the member's pod would run it:
// the local member first, the other members after it for the time the local
// member is a learner.
func (tc *testCluster) newSidecar(log logr.Logger) func(m *localetcd.Member) (http.Handler, error) {
	return func(m *localetcd.Member) (http.Handler, error) {
		eps := []string{m.LocalClientURL}
		for _, o := range tc.r.Members() {
			if o != m && o.Running() {
				eps = append(eps, o.ClientURL)
			}
		}
		s, err := sidecar.New(sidecar.Config{
			Endpoints: eps,
			EtcdTLS:   m.ClientTLSConfig(),
			Registry:  prometheus.NewRegistry(),
			Logger:    log.WithValues("sidecar", m.Name),
		})
		if err != nil {
			return nil, err
		}
		tc.mu.Lock()
		tc.sidecars[m.Name] = s
		tc.mu.Unlock()
		return s, nil
	}
}

// client calls m's sidecar with m's certificate, which the CA signed.
func (tc *testCluster) client(m *localetcd.Member) *sidecar.Client {
	return sidecar.NewClient(m.SidecarURL, m.ClientTLSConfig())
}

// httpClient is a raw HTTPS client; withCert false presents no certificate.
func (tc *testCluster) httpClient(m *localetcd.Member, withCert bool) *http.Client {
	cfg := &tls.Config{RootCAs: tc.ca.Pool(), MinVersion: tls.VersionTLS12}
	if withCert {
		cfg = m.ClientTLSConfig()
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
}

// membership is etcd's member list read directly (not through a sidecar):
// one line per member with everything a reconfiguration changes.
func (tc *testCluster) membership(g Gomega, via *localetcd.Member) []string {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{via.LocalClientURL}, TLS: via.ClientTLSConfig(), DialTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	var out []string
	for _, m := range resp.Members {
		out = append(out, fmt.Sprintf("%x name=%s learner=%t peers=%v", m.ID, m.Name, m.IsLearner, m.PeerURLs))
	}
	slices.Sort(out)
	return out
}

func memberByName(l *sidecar.MemberList, name string) *sidecar.Member {
	for i := range l.Members {
		if l.Members[i].Name == name {
			return &l.Members[i]
		}
	}
	return nil
}

func leaderName(l *sidecar.MemberList) string {
	for _, m := range l.Members {
		if m.IsLeader {
			return m.Name
		}
	}
	return ""
}

// rawCall sends one request and returns the status and the error reason.
func rawCall(hc *http.Client, method, url, body string, header map[string]string) (int, string, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var answer struct{ Reason string }
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		return resp.StatusCode, "", fmt.Errorf("decoding the answer: %w", err)
	}
	return resp.StatusCode, answer.Reason, nil
}
