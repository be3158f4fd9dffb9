package cli

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd/etcdtest"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// A learner's gate serves once etcd answers (its health is judged through
// it), and the learner's refusal of a write reaches the client through the
// gate as etcd sent it, not as a stream closed without a status.
func TestLearnerErrorsPassItsGate(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 1)})
	learner, err := c.Runtime.JoinAsLearner(ctx, "m-1", localetcd.MemberOptions{}, c.Members[0])
	g.Expect(err).NotTo(HaveOccurred())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	address := l.Addr().String()
	g.Expect(l.Close()).To(Succeed())
	flags := gateFlags{address: address, backend: learner.LocalClientURL}
	_, stop, err := flags.start(learner.ClientTLSConfig(), testr.New(t))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(stop)
	g.Eventually(func() error {
		conn, err := net.DialTimeout("tcp", address, time.Second)
		if err == nil {
			_ = conn.Close()
		}
		return err
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + address}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	for range 20 {
		callCtx, callCancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := cli.Put(callCtx, "/gate/learner", "1")
		callCancel()
		g.Expect(err).To(MatchError(ContainSubstring("rpc not supported for learner")))
	}
}

// TestGateServesTLSAsEtcdDoes: with etcd's own server certificate and CA
// (as the webhook points the gate at druid's volumes), the gate serves
// etcd's clients TLS and lets in only those whose client certificate etcd's
// CA signed, as etcd's client-cert-auth does: a client of another shoot's
// CA, or one without a certificate, is refused at the handshake and writes
// nothing.
func TestGateServesTLSAsEtcdDoes(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 1)})
	m := c.Members[0]
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	address := l.Addr().String()
	g.Expect(l.Close()).To(Succeed())
	flags := gateFlags{address: address, backend: m.LocalClientURL, cert: m.TLS.CertFile, key: m.TLS.KeyFile, clientCA: m.TLS.CAFile}
	_, stop, err := flags.start(m.ClientTLSConfig(), testr.New(t))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(stop)

	other, err := pki.NewCA("another-shoot-ca")
	g.Expect(err).NotTo(HaveOccurred())
	client := func(issuer *pki.CA) *clientv3.Client {
		var p *pki.Pair
		if issuer != nil {
			pair, err := issuer.Issue("kube-apiserver")
			g.Expect(err).NotTo(HaveOccurred())
			p = &pair
		}
		cfg, err := c.CA.ClientConfig(p)
		g.Expect(err).NotTo(HaveOccurred())
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://" + address}, TLS: cfg, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = cli.Close() })
		return cli
	}
	put := func(cli *clientv3.Client, key string) error {
		callCtx, callCancel := context.WithTimeout(ctx, 3*time.Second)
		defer callCancel()
		_, err := cli.Put(callCtx, key, "1")
		return err
	}

	own := client(c.CA)
	g.Eventually(func() error { return put(own, "/gate/tls/own") }).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	for name, cli := range map[string]*clientv3.Client{"another shoot's CA": client(other), "no certificate": client(nil)} {
		err := put(cli, "/gate/tls/"+strings.ReplaceAll(name, " ", "-"))
		g.Expect(err).To(HaveOccurred(), name)
	}
	direct, err := m.Client()
	g.Expect(err).NotTo(HaveOccurred())
	resp, err := direct.Get(ctx, "/gate/tls/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	g.Expect(err).NotTo(HaveOccurred())
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	g.Expect(keys).To(ConsistOf("/gate/tls/own"), "only the client of etcd's CA wrote")

	// The handshake itself: etcd's server certificate, a client certificate required.
	serverCert, err := tls.LoadX509KeyPair(m.TLS.CertFile, m.TLS.KeyFile)
	g.Expect(err).NotTo(HaveOccurred())
	cfg, err := c.CA.ClientConfig(nil)
	g.Expect(err).NotTo(HaveOccurred())
	conn, err := tls.Dial("tcp", address, cfg)
	if err == nil {
		g.Expect(conn.ConnectionState().PeerCertificates[0].Raw).To(Equal(serverCert.Certificate[0]), "served with etcd's own certificate")
		// TLS 1.3 reports a missing client certificate at the first read.
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		_ = conn.Close()
	}
	g.Expect(err).To(MatchError(ContainSubstring("certificate required")))
}
