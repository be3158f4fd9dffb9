package etcdwrapper

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

const (
	// readinessGetTimeout bounds each readiness Get.
	readinessGetTimeout = 5 * time.Second
	// etcdDialTimeout is the readiness client's dial timeout.
	etcdDialTimeout = 5 * time.Second
	// readinessKey is the key the readiness check reads; its value and
	// existence do not matter, only that a linearizable read succeeds.
	readinessKey = "foo"
)

// readiness holds the outcome of the last readiness check and serves it on
// /readyz, so the kubelet's probe never waits on etcd.
type readiness struct {
	ready atomic.Bool
}

// check does one linearizable Get. It fails on a learner (etcd serves
// learners only serializable reads), on a member without a leader or quorum,
// and on a member that is not serving.
func check(ctx context.Context, kv clientv3.KV) error {
	ctx, cancel := context.WithTimeout(ctx, readinessGetTimeout)
	defer cancel()
	_, err := kv.Get(ctx, readinessKey)
	return err
}

// poll checks at once and then every interval until ctx ends.
func (r *readiness) poll(ctx context.Context, kv clientv3.KV, interval time.Duration, log *zap.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		err := check(ctx, kv)
		if err != nil {
			log.Error("failed to retrieve from etcd db", zap.Error(err))
		}
		r.ready.Store(err == nil)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ServeHTTP answers /readyz: 200 when the last check succeeded, else 503,
// with an empty body and whatever the method.
func (r *readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if r.ready.Load() {
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
}

// clientTLSEnabled is the real wrapper's test for TLS towards etcd: etcd's
// client-transport-security names a certificate, a key and a trusted CA.
func clientTLSEnabled(cfg *embed.Config) bool {
	t := cfg.ClientTLSInfo
	return strings.TrimSpace(t.CertFile) != "" && strings.TrimSpace(t.KeyFile) != "" && strings.TrimSpace(t.TrustedCAFile) != ""
}

// newEtcdClient builds the readiness check's client for
// <etcd-server-name>:<etcd-client-port>; with TLS it trusts etcd's own
// trusted CA and presents the flags' client certificate.
func newEtcdClient(ctx context.Context, c Config, etcdCfg *embed.Config, log *zap.Logger) (*clientv3.Client, error) {
	scheme := "http"
	var tlsConf *tls.Config
	if clientTLSEnabled(etcdCfg) {
		scheme = "https"
		pem, err := os.ReadFile(etcdCfg.ClientTLSInfo.TrustedCAFile)
		if err != nil {
			return nil, fmt.Errorf("reading etcd's trusted CA: %w", err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		cert, err := tls.LoadX509KeyPair(c.EtcdClientTLS.CertPath, c.EtcdClientTLS.KeyPath)
		if err != nil {
			return nil, fmt.Errorf("loading etcd client certificate: %w", err)
		}
		tlsConf = &tls.Config{
			MinVersion:   tls.VersionTLS12,
			RootCAs:      pool,
			ServerName:   c.EtcdClientTLS.ServerName,
			Certificates: []tls.Certificate{cert},
		}
	}
	return clientv3.New(clientv3.Config{
		Context:     ctx,
		Endpoints:   []string{fmt.Sprintf("%s://%s:%d", scheme, c.EtcdClientTLS.ServerName, c.EtcdClientPort)},
		DialTimeout: etcdDialTimeout,
		TLS:         tlsConf,
		Logger:      log.Named("etcd-client"),
	})
}
