package sidecar_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/druid-stretch/druid-stretch/internal/etcdconfig"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestMemberWithDataStartsKnownByItsAdvertisedPeerURLs restarts a member of
// a real cluster the way a roll of druid's pods does after the Etcd got
// additional peer URLs: its etcd is down, its configuration advertises one
// more peer URL than etcd's member list has. Asked for /config, its sidecar
// updates the member's peer URLs before etcd starts, so that backup-restore
// finds nothing to update (and does not restart etcd under the client gate
// once it runs). The pod's next start changes nothing, and the member
// rejoins.
func TestMemberWithDataStartsKnownByItsAdvertisedPeerURLs(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	tc := startCluster(t, 3, clusterOptions{pollInterval: -1})
	m := tc.Members[0]
	other, err := tc.Members[1].Client()
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = other.Close() }()
	peerURLs := func(g Gomega) []string {
		resp, err := other.MemberList(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		for _, x := range resp.Members {
			if x.Name == m.Name {
				return x.PeerURLs
			}
		}
		g.Expect(m.Name).To(BeEmpty(), "etcd lists no member %s", m.Name)
		return nil
	}
	g.Expect(peerURLs(g)).To(Equal([]string{m.PeerURL}))

	// druid's etcd.conf.yaml for the member, and the Etcd's additional
	// peer URL for it.
	extra := "https://" + m.Name + ".site-a.example:2380"
	dir := t.TempDir()
	config := filepath.Join(dir, "etcd.conf.yaml")
	g.Expect(os.WriteFile(config, fmt.Appendf(nil, `name: etcd-config
data-dir: %s
initial-cluster: %s=%s
initial-advertise-peer-urls:
  %s: [%s]
advertise-client-urls:
  %s: [%s]
`, m.DataDir, m.Name, m.PeerURL, m.Name, m.PeerURL, m.Name, m.ClientURL), 0o600)).To(Succeed())
	g.Expect(m.Stop(ctx)).To(Succeed())

	// A sidecar process of the member, as each start of its pod runs one.
	start := func() string {
		srv, err := sidecar.New(sidecar.Config{
			Endpoints:                    localetcd.SidecarEndpoints(m, tc.Runtime.Members()),
			EtcdTLS:                      m.ClientTLSConfig(),
			InsecureAllowUnauthenticated: true,
			PollInterval:                 -1,
			Registry:                     prometheus.NewRegistry(),
			Joining: &sidecar.Joining{EtcdConfigFile: config, Member: etcdconfig.Member{Name: m.Name},
				AdditionalPeerURLs: []string{extra}, AdmissionFile: filepath.Join(dir, "admission.json")},
		})
		g.Expect(err).NotTo(HaveOccurred())
		hs := httptest.NewServer(srv)
		t.Cleanup(func() { hs.Close(); _ = srv.Close() })
		return hs.URL
	}

	code, body := get(t, start()+"/config")
	g.Expect(code).To(Equal(http.StatusOK), body)
	g.Expect(peerURLs(g)).To(Equal([]string{m.PeerURL, extra}), "etcd knows the member by every URL it advertises, before it starts")
	g.Expect(updates(g, tc.Members[1])).To(Equal(1))
	// The pod's next start: etcd has every advertised URL already.
	code, body = get(t, start()+"/config")
	g.Expect(code).To(Equal(http.StatusOK), body)
	g.Expect(peerURLs(g)).To(Equal([]string{m.PeerURL, extra}))
	g.Expect(updates(g, tc.Members[1])).To(Equal(1), "nothing left to update: no second member update")

	// The member starts on its data and serves with the others.
	g.Expect(m.Start(ctx, localetcd.InitialCluster(tc.Members...), localetcd.ClusterStateExisting)).To(Succeed())
	cli, err := m.Client()
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	g.Eventually(func() error { _, err := cli.Put(ctx, "after", "restart"); return err }).WithTimeout(30 * time.Second).Should(Succeed())
}

// updates counts the member updates another member applied, from its log.
func updates(g Gomega, m *localetcd.Member) int {
	b, err := os.ReadFile(m.LogPath)
	g.Expect(err).NotTo(HaveOccurred())
	return strings.Count(string(b), `"msg":"updated member"`)
}
