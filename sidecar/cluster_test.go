package sidecar_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd/etcdtest"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// testCluster is a real etcd cluster with TLS, each member with a sidecar
// served over HTTPS by the local member runtime.
type testCluster struct {
	*etcdtest.Cluster
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
	// pollInterval is the sidecars' background poll (0: the default; below
	// 0: none).
	pollInterval time.Duration
}

func startCluster(t testing.TB, n int, o clusterOptions) *testCluster {
	t.Helper()
	return &testCluster{etcdtest.Start(t, etcdtest.Options{
		Names:     etcdtest.Numbered("etcd", n),
		Sites:     o.sites,
		OneWay:    o.oneWay,
		Heartbeat: o.heartbeat,
		Election:  o.election,
		Logger:    o.logger,

		SidecarPollInterval: o.pollInterval,
	})}
}

// client calls m's sidecar with m's certificate, which the CA signed.
func (tc *testCluster) client(m *localetcd.Member) *sidecar.Client {
	return sidecar.NewClient(m.SidecarURL, m.ClientTLSConfig())
}

// httpClient is a raw HTTPS client; withCert false presents no certificate.
func (tc *testCluster) httpClient(m *localetcd.Member, withCert bool) *http.Client {
	cfg := &tls.Config{RootCAs: tc.CA.Pool(), MinVersion: tls.VersionTLS12}
	if withCert {
		cfg = m.ClientTLSConfig()
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
}

// lockValue is the membership lock's key read directly from etcd through
// via (not through a sidecar): its value, or "no lock".
func (tc *testCluster) lockValue(g Gomega, via *localetcd.Member) string {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{via.LocalClientURL}, TLS: via.ClientTLSConfig(), DialTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, sidecar.LockKey)
	g.Expect(err).NotTo(HaveOccurred())
	if len(resp.Kvs) == 0 {
		return "no lock"
	}
	return string(resp.Kvs[0].Value)
}

// membership is etcd's member list read directly (not through a sidecar):
// one line per member with everything a reconfiguration changes.
func (tc *testCluster) membership(g Gomega, via *localetcd.Member) []string {
	var out []string
	for _, m := range tc.MemberList(g, via) {
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
	defer func() { _ = resp.Body.Close() }()
	var answer struct{ Reason string }
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		return resp.StatusCode, "", fmt.Errorf("decoding the answer: %w", err)
	}
	return resp.StatusCode, answer.Reason, nil
}

// lockToken is a lock token of a process started age ago, as a controller
// makes it.
func lockToken(age time.Duration) string {
	token, err := sidecar.NewLockToken(time.Now().Add(-age))
	if err != nil {
		panic(err)
	}
	return token
}
