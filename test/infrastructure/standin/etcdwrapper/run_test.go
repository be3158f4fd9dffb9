package etcdwrapper

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zaptest"

	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// etcdConfigYAML is a single-member configuration as backup-restore's
// /config serves it (druid's keys, this member's values), on loopback.
func etcdConfigYAML(m loopbackMember, dataDir, clientSecurity string) string {
	return fmt.Sprintf(`name: %s
data-dir: %s
metrics: basic
snapshot-count: 10000
enable-grpc-gateway: false
quota-backend-bytes: 8589934592
initial-cluster-token: etcd-cluster
initial-cluster-state: new
initial-cluster: %s
auto-compaction-mode: periodic
auto-compaction-retention: 30m
listen-peer-urls: %s
listen-client-urls: %s
initial-advertise-peer-urls: %s
advertise-client-urls: %s
next-cluster-version-compatible: true
log-level: error
%s`, m.name, dataDir, m.initialClusterEntry, m.peerURL, m.clientURL, m.peerURL, m.clientURL, clientSecurity)
}

// runInBackground runs Run until the test ends it with the returned
// cancel; done delivers Run's result once and is closed after it, so that
// a deferred receive never blocks.
func runInBackground(t *testing.T, c Config, o Options) (done <-chan error, cancel context.CancelFunc) {
	log := zaptest.NewLogger(t)
	ctx, cancel := context.WithCancel(context.Background())
	d := make(chan error, 1)
	go func() {
		d <- Run(ctx, c, o, log)
		close(d)
	}()
	return d, cancel
}

func TestRunPlain(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	m := newLoopbackMember(t, "etcd-main-0", "http")
	dataDir := filepath.Join(t.TempDir(), "new.etcd")
	fake := newFakeBackupRestore(etcdConfigYAML(m, dataDir, ""))
	br := httptest.NewServer(fake)
	defer br.Close()

	o := testOptions(t)
	g.Expect(captureExitCode(os.Interrupt, o.ExitCodeFile)).To(Succeed())
	c, _, err := ParseFlags([]string{
		"--backup-restore-host-port=" + strings.TrimPrefix(br.URL, "http://"),
		"--etcd-server-name=127.0.0.1",
		"--backup-restore-tls-enabled=false",
		"--etcd-client-port=" + strconv.Itoa(m.clientPort),
		"--etcd-wrapper-port=" + strconv.Itoa(freePort(t)),
	})
	g.Expect(err).NotTo(HaveOccurred())
	wrapper := "http://127.0.0.1:" + strconv.Itoa(c.WrapperPort)

	done, cancel := runInBackground(t, c, o)
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Logf("etcd-wrapper's run ended: %v", err)
		}
	}()

	g.Eventually(readyzStatus(wrapper), 30*time.Second, 20*time.Millisecond).Should(Equal(http.StatusOK))
	g.Expect(fake.startModes()).To(Equal([]string{"sanity"}))
	g.Expect(o.ExitCodeFile).NotTo(BeAnExistingFile())
	g.Expect(os.ReadFile(o.ConfigFile)).To(ContainSubstring("name: etcd-main-0"))

	// Only POST stops the wrapper.
	resp, err := http.Get(wrapper + "/stop")
	g.Expect(err).NotTo(HaveOccurred())
	_ = resp.Body.Close()
	g.Consistently(done, 200*time.Millisecond).ShouldNot(Receive())
	resp, err = http.Post(wrapper+"/stop", "", nil)
	g.Expect(err).NotTo(HaveOccurred())
	_ = resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	g.Eventually(done, 30*time.Second).Should(Receive(BeNil()))

	// etcd and the wrapper server are gone.
	_, err = net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(m.clientPort)))
	g.Expect(err).To(HaveOccurred())
	_, err = net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.WrapperPort)))
	g.Expect(err).To(HaveOccurred())
}

// With TLS to backup-restore and to etcd, as druid configures it when both
// are set: the readiness client verifies etcd against etcd's trusted CA and
// authenticates with the flags' certificate, and the wrapper serves HTTPS
// with etcd's server certificate.
func TestRunTLS(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ca, err := pki.NewCA("etcd-ca")
	g.Expect(err).NotTo(HaveOccurred())
	certs := t.TempDir()
	server, err := ca.IssueFiles(certs, "server", "etcd-main-local", "127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	client, err := ca.IssueFiles(certs, "client", "etcd-client")
	g.Expect(err).NotTo(HaveOccurred())

	m := newLoopbackMember(t, "etcd-main-0", "https")
	security := fmt.Sprintf("client-transport-security:\n  cert-file: %s\n  key-file: %s\n  client-cert-auth: true\n  trusted-ca-file: %s\n  auto-tls: false\n",
		server.CertFile, server.KeyFile, server.CAFile)
	br := httptest.NewTLSServer(newFakeBackupRestore(etcdConfigYAML(m, filepath.Join(t.TempDir(), "new.etcd"), security)))
	defer br.Close()
	brConfig := backupRestoreConfigFor(t, br)

	c, _, err := ParseFlags([]string{
		"--backup-restore-host-port=" + brConfig.HostPort,
		"--etcd-server-name=127.0.0.1",
		"--backup-restore-tls-enabled=true",
		"--backup-restore-ca-cert-bundle-path=" + brConfig.CACertBundlePath,
		"--etcd-client-cert-path=" + client.CertFile,
		"--etcd-client-key-path=" + client.KeyFile,
		"--etcd-client-port=" + strconv.Itoa(m.clientPort),
		"--etcd-wrapper-port=" + strconv.Itoa(freePort(t)),
	})
	g.Expect(err).NotTo(HaveOccurred())

	done, cancel := runInBackground(t, c, testOptions(t))
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Logf("etcd-wrapper's run ended: %v", err)
		}
	}()

	tlsConf, err := ca.ClientConfig(nil)
	g.Expect(err).NotTo(HaveOccurred())
	tlsConf.ServerName = "etcd-main-local"
	httpsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf}}
	defer httpsClient.CloseIdleConnections()
	wrapper := "https://127.0.0.1:" + strconv.Itoa(c.WrapperPort)
	g.Eventually(func() (int, error) {
		resp, err := httpsClient.Get(wrapper + "/readyz")
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}, 30*time.Second, 20*time.Millisecond).Should(Equal(http.StatusOK))

	// etcd refuses a client without a certificate, so the readiness client
	// did authenticate.
	bare, err := clientv3.New(clientv3.Config{Endpoints: []string{m.clientURL}, TLS: tlsConf, DialTimeout: time.Second, Logger: zaptest.NewLogger(t)})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = bare.Close() }()
	getCtx, getCancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer getCancel()
	_, err = bare.Get(getCtx, readinessKey)
	g.Expect(err).To(HaveOccurred())

	cancel()
	g.Eventually(done, 30*time.Second).Should(Receive(BeNil()))
}

func TestRunFailsBeforeEtcd(t *testing.T) {
	t.Run("invalid backup-restore address", func(t *testing.T) {
		c, _, _ := ParseFlags([]string{"--backup-restore-host-port=etcd-main-local"})
		err := Run(context.Background(), c, testOptions(t), zaptest.NewLogger(t))
		NewWithT(t).Expect(err).To(MatchError(ContainSubstring("<host>:<port>")))
	})
	t.Run("etcd refuses the configuration", func(t *testing.T) {
		g := NewWithT(t)
		m := newLoopbackMember(t, "etcd-main-0", "http")
		// The initial cluster lacks this member.
		other := newLoopbackMember(t, "etcd-main-1", "http")
		cfg := strings.Replace(etcdConfigYAML(m, filepath.Join(t.TempDir(), "new.etcd"), ""),
			"initial-cluster: "+m.initialClusterEntry, "initial-cluster: "+other.initialClusterEntry, 1)
		br := httptest.NewServer(newFakeBackupRestore(cfg))
		defer br.Close()
		c, _, err := ParseFlags([]string{
			"--backup-restore-host-port=" + strings.TrimPrefix(br.URL, "http://"),
			"--etcd-server-name=127.0.0.1",
			"--etcd-client-port=" + strconv.Itoa(m.clientPort),
			"--etcd-wrapper-port=" + strconv.Itoa(freePort(t)),
		})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(Run(context.Background(), c, testOptions(t), zaptest.NewLogger(t))).To(MatchError(ContainSubstring("in the initial cluster configuration")))
		// The wrapper port is released.
		_, err = net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.WrapperPort)))
		g.Expect(err).To(HaveOccurred())
	})
	t.Run("wrapper port taken", func(t *testing.T) {
		g := NewWithT(t)
		m := newLoopbackMember(t, "etcd-main-0", "http")
		br := httptest.NewServer(newFakeBackupRestore(etcdConfigYAML(m, filepath.Join(t.TempDir(), "new.etcd"), "")))
		defer br.Close()
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = taken.Close() }()
		c, _, err := ParseFlags([]string{
			"--backup-restore-host-port=" + strings.TrimPrefix(br.URL, "http://"),
			"--etcd-server-name=127.0.0.1",
			"--etcd-client-port=" + strconv.Itoa(m.clientPort),
			"--etcd-wrapper-port=" + strconv.Itoa(taken.Addr().(*net.TCPAddr).Port),
		})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(Run(context.Background(), c, testOptions(t), zaptest.NewLogger(t))).To(MatchError(ContainSubstring("address already in use")))
	})
}
