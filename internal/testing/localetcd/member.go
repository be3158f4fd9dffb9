package localetcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/druid-stretch/druid-stretch/internal/testing/childproc"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
)

// Member is one local etcd member: its addresses, files and process.
type Member struct {
	// Name is the etcd member name.
	Name string
	// Site is the member's location (MemberOptions.Site).
	Site string
	// PeerURL is the advertised peer URL (the WAN front when a WAN is set).
	PeerURL string
	// ClientURL is the advertised client URL (the WAN front when a WAN is set).
	ClientURL string
	// LocalPeerURL is the member's own peer listener, bypassing any WAN.
	LocalPeerURL string
	// LocalClientURL reaches the member's own client port directly, as its
	// own sidecar does (same pod, no WAN).
	LocalClientURL string
	// SidecarURL is where the member's sidecar serves; empty without
	// Options.Sidecar.
	SidecarURL string
	// DataDir is etcd's --data-dir; Stop and Kill keep it.
	DataDir string
	// LogPath is the file collecting etcd's output across restarts.
	LogPath string
	// TLS names the member's certificate, key and CA files; zero without a CA.
	TLS pki.Bundle

	r     *Runtime
	extra []string
	ep    endpoints

	cert       tls.Certificate // the member's own certificate, when TLS is on
	sidecarCfg *tls.Config     // server side of the sidecar's mutual TLS

	mu             sync.Mutex
	proc           *process
	initialCluster string
	state          ClusterState
	sidecar        *http.Server
	sidecarHandler http.Handler
}

// process is one run of etcd.
type process struct {
	cmd  *exec.Cmd
	pid  int
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // Wait's result, readable after done
	// logStart is where this run's output begins in the log file.
	logStart int64
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (m *Member) issueCertificate(dir string) error {
	ca := m.r.opts.CA
	b, err := ca.IssueFiles(dir, m.Name, "127.0.0.1", "localhost", m.Name)
	if err != nil {
		return fmt.Errorf("localetcd: issuing the certificate of %q: %w", m.Name, err)
	}
	cert, err := tls.LoadX509KeyPair(b.CertFile, b.KeyFile)
	if err != nil {
		return fmt.Errorf("localetcd: loading the certificate of %q: %w", m.Name, err)
	}
	m.TLS, m.cert = b, cert
	// Without a client certificate a request still reaches the handler, which
	// answers 401 to mutating calls (docs/security.md); probes need no certificate.
	m.sidecarCfg = &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    ca.Pool(),
		ClientAuth:   tls.VerifyClientCertIfGiven,
		MinVersion:   tls.VersionTLS12,
	}
	return nil
}

// ClientTLSConfig trusts the runtime's CA and presents the member's own
// certificate, which etcd and every sidecar of the runtime accept as a
// client certificate. It is nil without a CA.
func (m *Member) ClientTLSConfig() *tls.Config {
	if m.r.opts.CA == nil {
		return nil
	}
	return &tls.Config{
		RootCAs:      m.r.opts.CA.Pool(),
		Certificates: []tls.Certificate{m.cert},
		MinVersion:   tls.VersionTLS12,
	}
}

// args renders etcd's command line.
func (m *Member) args(initialCluster string, state ClusterState) []string {
	o := m.r.opts
	a := []string{
		"--name=" + m.Name,
		"--data-dir=" + m.DataDir,
		"--listen-peer-urls=" + m.LocalPeerURL,
		"--initial-advertise-peer-urls=" + m.PeerURL,
		"--listen-client-urls=" + m.LocalClientURL,
		"--advertise-client-urls=" + m.ClientURL,
		"--initial-cluster=" + initialCluster,
		"--initial-cluster-state=" + string(state),
		"--initial-cluster-token=" + m.r.token,
		"--heartbeat-interval=" + strconv.FormatInt(o.HeartbeatInterval.Milliseconds(), 10),
		"--election-timeout=" + strconv.FormatInt(o.ElectionTimeout.Milliseconds(), 10),
	}
	if o.CA != nil {
		a = append(a,
			"--cert-file="+m.TLS.CertFile, "--key-file="+m.TLS.KeyFile,
			"--trusted-ca-file="+m.TLS.CAFile, "--client-cert-auth=true",
			"--peer-cert-file="+m.TLS.CertFile, "--peer-key-file="+m.TLS.KeyFile,
			"--peer-trusted-ca-file="+m.TLS.CAFile, "--peer-client-cert-auth=true",
		)
	}
	return append(a, m.extra...)
}

// Start starts etcd and waits until it serves clients (see WaitReady). The
// initial cluster and state are etcd's --initial-cluster and
// --initial-cluster-state; once the data dir exists etcd ignores them. If
// Start fails, the process is ended: a member is either ready or not running.
func (m *Member) Start(ctx context.Context, initialCluster string, state ClusterState) error {
	if state != ClusterStateNew && state != ClusterStateExisting {
		return fmt.Errorf("localetcd: member %q: cluster state %q is neither %q nor %q", m.Name, state, ClusterStateNew, ClusterStateExisting)
	}
	if initialCluster == "" {
		return fmt.Errorf("localetcd: member %q: the initial cluster is empty", m.Name)
	}
	p, err := m.spawn(initialCluster, state)
	if err != nil {
		return err
	}
	if err := m.waitReady(ctx, p); err != nil {
		_ = m.Kill()
		return err
	}
	if err := m.startSidecar(); err != nil {
		_ = m.Kill()
		return err
	}
	m.r.log.Info("etcd member ready", "member", m.Name, "pid", p.pid, "site", m.Site, "clientURL", m.ClientURL, "peerURL", m.PeerURL)
	return nil
}

// spawn execs etcd; its output goes straight into the log file.
func (m *Member) spawn(initialCluster string, state ClusterState) (*process, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Hold the runtime's lock until the process is recorded, so Close either
	// sees this process or makes us refuse to start it.
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	if m.r.closed {
		return nil, errClosed
	}
	if m.proc != nil && !m.proc.exited() {
		return nil, fmt.Errorf("localetcd: member %q is already running (pid %d)", m.Name, m.proc.pid)
	}
	if err := m.claimPorts(); err != nil {
		return nil, fmt.Errorf("localetcd: starting %q: %w", m.Name, err)
	}
	logf, err := os.OpenFile(m.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("localetcd: opening the log of %q: %w", m.Name, err)
	}
	defer func() { _ = logf.Close() }() // the child holds its own copy
	var logStart int64
	if st, err := logf.Stat(); err == nil {
		logStart = st.Size()
	}
	args := m.args(initialCluster, state)
	_, _ = fmt.Fprintf(logf, "--- localetcd %s: %s %s\n", time.Now().Format(time.RFC3339Nano), m.r.opts.EtcdBinary, strings.Join(args, " "))

	cmd := exec.Command(m.r.opts.EtcdBinary, args...)
	cmd.Dir = filepath.Dir(m.DataDir)
	cmd.Env = etcdEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := childproc.Start(cmd); err != nil {
		return nil, fmt.Errorf("localetcd: starting etcd for %q (%s): %w", m.Name, m.r.opts.EtcdBinary, err)
	}
	p := &process{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{}), logStart: logStart}
	if wan := m.r.opts.WAN; wan != nil {
		wan.RegisterProcess(p.pid, m.Site)
	}
	go func() {
		p.err = cmd.Wait()
		if wan := m.r.opts.WAN; wan != nil {
			wan.UnregisterProcess(p.pid)
		}
		// Log before done: whoever waits on done (Close) may end the logger's test.
		m.r.log.V(1).Info("etcd process exited", "member", m.Name, "pid", p.pid, "status", fmt.Sprint(p.err))
		close(p.done)
	}()
	m.proc, m.initialCluster, m.state = p, initialCluster, state
	return p, nil
}

// etcdEnv is the parent's environment without ETCD_* variables: etcd reads
// them as flags, and one left over in a developer's shell would change or
// break every member.
func etcdEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	return env
}

func (m *Member) current() *process {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil || m.proc.exited() {
		return nil
	}
	return m.proc
}

// Running reports whether the member's etcd process is alive.
func (m *Member) Running() bool { return m.current() != nil }

// PID is the process id of the running etcd, 0 when it is not running.
func (m *Member) PID() int {
	if p := m.current(); p != nil {
		return p.pid
	}
	return 0
}

// Stop sends SIGTERM and waits for etcd to exit (a leader hands over its
// leadership first). If ctx ends first the process is killed. The data dir
// is kept. Stopping a member that is not running does nothing.
func (m *Member) Stop(ctx context.Context) error {
	p := m.current()
	if p == nil {
		return nil
	}
	_ = syscall.Kill(-p.pid, syscall.SIGTERM)
	select {
	case <-p.done:
		m.r.log.Info("etcd member stopped", "member", m.Name, "pid", p.pid)
		return nil
	case <-ctx.Done():
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("localetcd: member %q did not stop after SIGTERM, killed it: %w", m.Name, ctx.Err())
	}
}

// Kill ends etcd with SIGKILL, as a crash would, and waits until it is
// gone. The data dir is kept. Killing a member that is not running does
// nothing.
func (m *Member) Kill() error {
	p := m.current()
	if p == nil {
		return nil
	}
	// The whole process group: etcd starts no children, but nothing it
	// might start should outlive it.
	if err := syscall.Kill(-p.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("localetcd: killing member %q (pid %d): %w", m.Name, p.pid, err)
	}
	<-p.done
	m.r.log.Info("etcd member killed", "member", m.Name, "pid", p.pid)
	return nil
}

// Restart stops the member (if running) and starts it again on its data
// dir, waiting until it is ready.
func (m *Member) Restart(ctx context.Context) error {
	m.mu.Lock()
	ic, state := m.initialCluster, m.state
	m.mu.Unlock()
	if ic == "" {
		return fmt.Errorf("localetcd: member %q was never started, so it cannot restart", m.Name)
	}
	if err := m.Stop(ctx); err != nil {
		return err
	}
	return m.Start(ctx, ic, state)
}

// Client returns a v3 client that talks to this member only, through its
// advertised ClientURL, with TLS as configured. Runtime.Close closes it.
func (m *Member) Client() (*clientv3.Client, error) {
	c, err := newClient([]string{m.ClientURL}, m.ClientTLSConfig())
	if err != nil {
		return nil, fmt.Errorf("localetcd: client for member %q: %w", m.Name, err)
	}
	if err := m.r.track(c); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func newClient(endpoints []string, tlsCfg *tls.Config) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		TLS:         tlsCfg,
		// The client logs every reconnect, which fault tests provoke on purpose.
		Logger: zap.NewNop(),
	})
}
