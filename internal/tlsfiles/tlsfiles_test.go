package tlsfiles_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/tlsfiles"
)

// secretVolume writes files as the kubelet writes a Secret volume: into a
// new timestamped directory, then ..data swapped to it in one rename and
// the directory before removed, with each key a symlink through ..data.
type secretVolume struct {
	dir string
	gen int
}

func (v *secretVolume) write(t *testing.T, files map[string][]byte) {
	t.Helper()
	v.gen++
	ts := fmt.Sprintf("..%d", v.gen)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(v.dir, ts, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	// The kubelet removes the directory ..data pointed to before.
	if v.gen > 1 {
		if err := os.RemoveAll(filepath.Join(v.dir, fmt.Sprintf("..%d", v.gen-1))); err != nil {
			t.Fatal(err)
		}
	}
	for name := range files {
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func (v *secretVolume) path(name string) string { return filepath.Join(v.dir, name) }

// TestServerFollowsRenewedFiles: a server configured from a Secret volume
// verifies client certificates against the volume's CA bundle and serves
// the volume's certificate; the kubelet renewing the volume (a new server
// certificate; a CA bundle with a second shoot's CA added) applies from
// the next handshake on, while a connection opened before keeps serving;
// a renewal that cannot be read keeps the last good certificate.
func TestServerFollowsRenewedFiles(t *testing.T) {
	g := NewWithT(t)
	ca, err := pki.NewCA("shoot-a-ca")
	g.Expect(err).NotTo(HaveOccurred())
	other, err := pki.NewCA("shoot-b-ca")
	g.Expect(err).NotTo(HaveOccurred())
	first, err := ca.Issue("etcd-server", "127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	vol := &secretVolume{dir: t.TempDir()}
	vol.write(t, map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM, "ca.crt": ca.CertPEM()})

	cfg, err := tlsfiles.Server(t.Context(), vol.path("tls.crt"), vol.path("tls.key"), vol.path("ca.crt"), tls.RequireAndVerifyClientCert, "h2", "http/1.1")
	g.Expect(err).NotTo(HaveOccurred())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	srv := &http.Server{TLSConfig: cfg, ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprint(w, r.TLS.PeerCertificates[0].Subject.CommonName)
	})}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	url := "https://" + l.Addr().String()

	// client is an HTTP/2 client presenting a certificate of issuer that
	// trusts roots; serial reports the server certificate it was served.
	client := func(issuer *pki.CA, roots *x509.CertPool) *http.Client {
		pair, err := issuer.Issue("kube-apiserver")
		g.Expect(err).NotTo(HaveOccurred())
		c, err := pair.Certificate()
		g.Expect(err).NotTo(HaveOccurred())
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{c}, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 5 * time.Second}
	}
	serial := func(c *http.Client) (*big.Int, error) {
		resp, err := c.Get(url)
		if err != nil {
			return nil, err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, err
		}
		if string(body) != "kube-apiserver" || resp.ProtoMajor != 2 {
			return nil, fmt.Errorf("answered %q over HTTP/%d", body, resp.ProtoMajor)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber, nil
	}
	serialOf := func(p pki.Pair) *big.Int {
		c, err := p.Certificate()
		g.Expect(err).NotTo(HaveOccurred())
		x, err := x509.ParseCertificate(c.Certificate[0])
		g.Expect(err).NotTo(HaveOccurred())
		return x.SerialNumber
	}

	open := client(ca, ca.Pool())
	g.Expect(serial(open)).To(Equal(serialOf(first)))
	g.Expect(handshakeRefusal(t, l.Addr().String(), other, ca)).To(Equal("remote error: tls: unknown certificate authority"),
		"a client certificate of another shoot's CA is refused")

	// The server certificate renewed.
	second, err := ca.Issue("etcd-server", "127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	vol.write(t, map[string][]byte{"tls.crt": second.CertPEM, "tls.key": second.KeyPEM, "ca.crt": ca.CertPEM()})
	g.Eventually(func() (*big.Int, error) { return serial(client(ca, ca.Pool())) }).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Equal(serialOf(second)))
	g.Expect(serial(open)).To(Equal(serialOf(first)), "the connection opened before keeps its certificate and serves on")

	// The CA bundle gains the other CA, as in the first phase of a CA rotation.
	bundle := append(append([]byte{}, ca.CertPEM()...), other.CertPEM()...)
	vol.write(t, map[string][]byte{"tls.crt": second.CertPEM, "tls.key": second.KeyPEM, "ca.crt": bundle})
	g.Eventually(func() error { _, err := serial(client(other, ca.Pool())); return err }).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())

	// A renewal that cannot be read: the last good configuration serves on.
	third, err := ca.Issue("etcd-server", "127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	vol.write(t, map[string][]byte{"tls.crt": third.CertPEM, "tls.key": first.KeyPEM, "ca.crt": []byte("not PEM")})
	g.Consistently(func() (*big.Int, error) { return serial(client(other, ca.Pool())) }).WithTimeout(3 * time.Second).WithPolling(200 * time.Millisecond).Should(Equal(serialOf(second)))
}

func TestServerRefusesBadFiles(t *testing.T) {
	g := NewWithT(t)
	ca, err := pki.NewCA("shoot-a-ca")
	g.Expect(err).NotTo(HaveOccurred())
	b, err := ca.IssueFiles(t.TempDir(), "etcd-server", "127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	missing := filepath.Join(t.TempDir(), "missing.crt")
	notPEM := filepath.Join(t.TempDir(), "ca.crt")
	g.Expect(os.WriteFile(notPEM, []byte("not PEM"), 0o600)).To(Succeed())

	_, err = tlsfiles.Server(t.Context(), missing, b.KeyFile, b.CAFile, tls.RequireAndVerifyClientCert)
	g.Expect(err).To(MatchError(ContainSubstring(missing)))
	_, err = tlsfiles.Server(t.Context(), b.CertFile, b.KeyFile, notPEM, tls.RequireAndVerifyClientCert)
	g.Expect(err).To(MatchError(ContainSubstring("client CA bundle " + notPEM)))
	_, err = tlsfiles.Server(t.Context(), b.CertFile, b.CAFile, b.CAFile, tls.RequireAndVerifyClientCert)
	g.Expect(err).To(MatchError(ContainSubstring(b.CertFile)), "a key that is the CA certificate")
	_, err = tlsfiles.Server(t.Context(), b.CertFile, b.KeyFile, b.CAFile, tls.RequestClientCert)
	g.Expect(err).To(MatchError(ContainSubstring("without a client authentication that verifies")))
}

// TestClientFollowsRenewedFiles: a shoot's CA rotation, as gardenlet runs
// it, seen by a client of etcd (the sidecar, the client gate): the bundle
// gains the new CA, the server's and the client's certificates are
// reissued by it, the old CA leaves the bundle. A client configuration
// made from its files once fails at the end; tlsfiles.Client's, made at
// the start, connects at every phase.
func TestClientFollowsRenewedFiles(t *testing.T) {
	g := NewWithT(t)
	oldCA, err := pki.NewCA("shoot-ca-old")
	g.Expect(err).NotTo(HaveOccurred())
	newCA, err := pki.NewCA("shoot-ca-new")
	g.Expect(err).NotTo(HaveOccurred())
	issue := func(ca *pki.CA, cn string, hosts ...string) pki.Pair {
		p, err := ca.Issue(cn, hosts...)
		g.Expect(err).NotTo(HaveOccurred())
		return p
	}
	bundle := func(cas ...*pki.CA) []byte {
		var out []byte
		for _, ca := range cas {
			out = append(out, ca.CertPEM()...)
		}
		return out
	}
	server, client := &secretVolume{dir: t.TempDir()}, &secretVolume{dir: t.TempDir()}
	phase := func(serverCert, clientCert pki.Pair, cas ...*pki.CA) {
		server.write(t, map[string][]byte{"tls.crt": serverCert.CertPEM, "tls.key": serverCert.KeyPEM, "ca.crt": bundle(cas...)})
		client.write(t, map[string][]byte{"tls.crt": clientCert.CertPEM, "tls.key": clientCert.KeyPEM, "ca.crt": bundle(cas...)})
	}
	phase(issue(oldCA, "etcd-server", "etcd-main-local"), issue(oldCA, "etcd-client"), oldCA)

	serverTLS, err := tlsfiles.Server(t.Context(), server.path("tls.crt"), server.path("tls.key"), server.path("ca.crt"), tls.RequireAndVerifyClientCert)
	g.Expect(err).NotTo(HaveOccurred())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	srv := &http.Server{TLSConfig: serverTLS, ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprint(w, r.TLS.PeerCertificates[0].Issuer.CommonName)
	})}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })

	get := func(cfg *tls.Config) (string, error) {
		cfg = cfg.Clone()
		cfg.ServerName = "etcd-main-local"
		// A new connection each time: every call is a handshake.
		tr := &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + l.Addr().String())
		if err != nil {
			return "", err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		return string(body), err
	}
	followed, err := tlsfiles.Client(t.Context(), client.path("ca.crt"), client.path("tls.crt"), client.path("tls.key"))
	g.Expect(err).NotTo(HaveOccurred())
	readOnce, err := oldCA.ClientConfig(ptr(issue(oldCA, "etcd-client")))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(get(followed)).To(Equal("shoot-ca-old"))
	g.Expect(get(readOnce)).To(Equal("shoot-ca-old"))

	// Both CAs trusted; then both certificates reissued by the new one;
	// then the old CA gone.
	within := func(want string) {
		t.Helper()
		g.Eventually(func() (string, error) { return get(followed) }).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Equal(want))
	}
	phase(issue(oldCA, "etcd-server", "etcd-main-local"), issue(oldCA, "etcd-client"), oldCA, newCA)
	within("shoot-ca-old")
	phase(issue(newCA, "etcd-server", "etcd-main-local"), issue(newCA, "etcd-client"), oldCA, newCA)
	within("shoot-ca-new")
	phase(issue(newCA, "etcd-server", "etcd-main-local"), issue(newCA, "etcd-client"), newCA)
	within("shoot-ca-new")
	g.Eventually(func() error { _, err := get(readOnce); return err }).WithTimeout(30*time.Second).WithPolling(100*time.Millisecond).
		Should(MatchError(ContainSubstring("certificate")), "a client that read its files once is refused, and refuses the server")
	g.Consistently(func() (string, error) { return get(followed) }).WithTimeout(time.Second).WithPolling(100 * time.Millisecond).Should(Equal("shoot-ca-new"))

	// A server whose certificate names another host is refused, as Go
	// refuses it.
	wrongName := followed.Clone()
	wrongName.ServerName = "etcd-other-local"
	tr := &http.Transport{TLSClientConfig: wrongName, DisableKeepAlives: true}
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + l.Addr().String())
	if err == nil {
		_ = resp.Body.Close()
	}
	g.Expect(err).To(MatchError(ContainSubstring("etcd-other-local")))
}

func TestClientRefusesBadFiles(t *testing.T) {
	g := NewWithT(t)
	ca, err := pki.NewCA("shoot-a-ca")
	g.Expect(err).NotTo(HaveOccurred())
	b, err := ca.IssueFiles(t.TempDir(), "etcd-client")
	g.Expect(err).NotTo(HaveOccurred())
	missing := filepath.Join(t.TempDir(), "missing.crt")
	_, err = tlsfiles.Client(t.Context(), missing, b.CertFile, b.KeyFile)
	g.Expect(err).To(MatchError(ContainSubstring(missing)))
	_, err = tlsfiles.Client(t.Context(), b.CAFile, missing, b.KeyFile)
	g.Expect(err).To(MatchError(ContainSubstring(missing)))
	_, err = tlsfiles.Client(t.Context(), b.CAFile, b.CertFile, "")
	g.Expect(err).To(MatchError(ContainSubstring("must be given together")))
}

func ptr[T any](v T) *T { return &v }

// handshakeRefusal is how the server at addr answers a client certificate
// of issuer in the TLS handshake (server verified with roots): with TLS
// 1.3 the client learns of a refusal only from the server's alert after
// its own handshake ended, so it reads without writing (a request written
// at once races the alert: the server's close resets the connection).
func handshakeRefusal(t *testing.T, addr string, issuer, roots *pki.CA) string {
	t.Helper()
	pair, err := issuer.Issue("kube-apiserver")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := roots.ClientConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pair.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	// Presented whatever CAs the server names (Go's client would send
	// none that those CAs did not sign).
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		return err.Error()
	}
	return "the server accepted the connection"
}
