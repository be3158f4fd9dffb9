package localetcd

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// closeCounter is a sidecar handler that says who called it and counts
// its Close, so the test can see Runtime.Close reach it.
type closeCounter struct {
	member string
	closed *int
}

func (h closeCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	who := "anonymous"
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		who = r.TLS.VerifiedChains[0][0].Subject.CommonName
	}
	_, _ = fmt.Fprintf(w, "%s serves %s", h.member, who)
}

func (h closeCounter) Close() error { *h.closed++; return nil }

// TestTLS: peer and client traffic run on TLS with certificates from the
// CA; a client that lacks the CA or a certificate is refused; sidecars
// serve HTTPS and verify client certificates.
func TestTLS(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ca, err := pki.NewCA("localetcd-test")
	g.Expect(err).NotTo(HaveOccurred())
	other, err := pki.NewCA("someone-else")
	g.Expect(err).NotTo(HaveOccurred())
	closed := 0
	r := newRuntime(t, Options{CA: ca, Sidecar: func(m *Member) (http.Handler, error) {
		return closeCounter{member: m.Name, closed: &closed}, nil
	}})
	ctx := testContext(t, 2*time.Minute)

	ms, err := r.StartCluster(ctx, []string{"s1", "s2"}, MemberOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	for _, m := range ms {
		for _, u := range []string{m.PeerURL, m.ClientURL, m.LocalClientURL, m.SidecarURL} {
			g.Expect(u).To(HavePrefix("https://127.0.0.1:"))
		}
		g.Expect(m.TLS.CertFile).To(BeARegularFile())
	}
	_, err = client(t, ms[0]).Put(ctx, "secure", "yes")
	g.Expect(err).NotTo(HaveOccurred())
	got, err := client(t, ms[1]).Get(ctx, "secure") // replicated over peer TLS
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Kvs).To(HaveLen(1))

	// Refusals, on etcd's client port and on the sidecar.
	otherPair, err := other.Issue("intruder", "127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	foreign, err := other.ClientConfig(&otherPair)
	g.Expect(err).NotTo(HaveOccurred())
	foreign.RootCAs = ca.Pool() // trusts the server, but its own certificate is foreign
	// Present it although the server asks for its own CA: Go would otherwise
	// send no certificate at all, and this case would only repeat the next.
	foreignCert := foreign.Certificates[0]
	foreign.Certificates = nil
	foreign.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &foreignCert, nil }
	noCert, err := ca.ClientConfig(nil)
	g.Expect(err).NotTo(HaveOccurred())
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
		url  string
		want string // in the error, or in the body when the call succeeds
		ok   bool
	}{
		{"etcd: without the CA", &tls.Config{MinVersion: tls.VersionTLS12}, ms[0].LocalClientURL + "/readyz", "certificate signed by unknown authority", false},
		{"etcd: no client certificate", noCert, ms[0].LocalClientURL + "/readyz", "certificate required", false},
		{"etcd: certificate of another CA", foreign, ms[0].LocalClientURL + "/readyz", "unknown certificate authority", false},
		{"etcd: member certificate", ms[1].ClientTLSConfig(), ms[0].LocalClientURL + "/readyz", "ok", true},
		{"sidecar: without the CA", &tls.Config{MinVersion: tls.VersionTLS12}, ms[0].SidecarURL, "certificate signed by unknown authority", false},
		{"sidecar: certificate of another CA", foreign, ms[0].SidecarURL, "unknown certificate authority", false},
		{"sidecar: no client certificate reaches the handler unverified", noCert, ms[0].SidecarURL, "s1 serves anonymous", true},
		{"sidecar: member certificate is verified", ms[1].ClientTLSConfig(), ms[0].SidecarURL, "s1 serves s2", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc.cfg}}
			defer hc.CloseIdleConnections()
			resp, err := hc.Get(tc.url)
			if !tc.ok {
				g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = resp.Body.Close() }()
			body, _ := io.ReadAll(resp.Body)
			g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
			g.Expect(strings.TrimSpace(string(body))).To(Equal(tc.want))
		})
	}

	// The v3 client gets nothing without a certificate from the CA.
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ms[0].ClientURL}, TLS: noCert, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = c.Close() }()
	_, err = c.Get(testContext(t, time.Second), "secure")
	g.Expect(err).To(HaveOccurred())

	// A restart keeps the sidecar; Close ends it and closes its handler.
	sidecarURL := ms[0].SidecarURL
	g.Expect(ms[0].Restart(ctx)).To(Succeed())
	g.Expect(ms[0].SidecarURL).To(Equal(sidecarURL))
	g.Expect(closed).To(BeZero())
	g.Expect(r.Close()).To(Succeed())
	g.Expect(closed).To(Equal(2))
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: ms[1].ClientTLSConfig()}}
	resp, err := hc.Get(sidecarURL)
	if err == nil {
		_ = resp.Body.Close()
	}
	g.Expect(err).To(MatchError(ContainSubstring("connection refused")))
}
