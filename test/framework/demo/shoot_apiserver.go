package demo

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/druid-stretch/druid-stretch/internal/testing/childproc"
	"github.com/druid-stretch/druid-stretch/internal/testing/freeport"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// shootStopGrace is how long a stopped kube-apiserver may take to end its
// requests before it is killed: longer than its own request timeout (1
// minute by default), which bounds how long its graceful shutdown waits
// for requests in flight. 30 s was too short with two fault-matrix moves
// side by side on 2 cores.
const shootStopGrace = 90 * time.Second

// shootAPIServer is the kube-apiserver of a shoot whose etcd is the Env's
// Etcd, run in one cluster of the Env as a Gardener shoot control plane
// runs in each seed during a move: the real kube-apiserver binary as a
// process of its own, with the Etcd's members of its own cluster as its
// etcd, over the client TLS those members require.
//
// Its place on the WAN: the process is registered in its cluster's site
// (linkemu.WAN.RegisterProcess), so the link emulator, which finds a
// connection's site from the process that holds its socket, puts its etcd
// connections in that site: no delay to its own cluster's members and the
// Env's RTT to the other cluster's (which it never dials), and cut by a
// partition between the sites only towards the other one. Unregistered it
// would sit in the WAN's local site, at no distance from either site and
// outside every partition. Its clients (apiload, in this process) dial its
// secure port directly, not through a front: at no distance from it, as
// the Env's other clients and controllers are from either site.
type shootAPIServer struct {
	// Name names the server in apiload and the report (the cluster's
	// identity, a DNS label).
	Name string
	// Config reaches it as a system:masters user, client-go defaults
	// otherwise.
	Config *rest.Config

	cluster *Cluster
	env     *Env
	dir     string
	logPath string
	args    []string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has exited and been reaped
	waitErr error         // the process's exit, readable after done
	// etcdServers are the client URLs it was started with.
	etcdServers []string
}

// newShootAPIServer prepares the shoot kube-apiserver of cluster c: its
// folder, serving certificate, etcd client certificate, service-account
// key, a static token for its clients and a free port. It does not start it.
func (e *Env) newShootAPIServer(c *Cluster) (*shootAPIServer, error) {
	dir := filepath.Join(e.dir, "shoot-apiservers", e.Config.Namespace, c.Identity)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the folder of %s's shoot kube-apiserver: %w", c.Identity, err)
	}
	// The Env's CA signs both: etcd requires a client certificate it
	// signed, as it does from the Env's own workload client.
	serving, err := e.CA.IssueFiles(dir, "serving", "localhost", "127.0.0.1")
	if err != nil {
		return nil, fmt.Errorf("issuing the serving certificate of %s's shoot kube-apiserver: %w", c.Identity, err)
	}
	etcdClient, err := e.CA.IssueFiles(dir, "etcd-client", "localhost", "127.0.0.1")
	if err != nil {
		return nil, fmt.Errorf("issuing the etcd client certificate of %s's shoot kube-apiserver: %w", c.Identity, err)
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	saPath := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(saPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}), 0o600); err != nil {
		return nil, err
	}
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return nil, err
	}
	adminToken := hex.EncodeToString(token)
	tokensPath := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokensPath, fmt.Appendf(nil, "%s,shoot-admin,shoot-admin,system:masters\n", adminToken), 0o600); err != nil {
		return nil, err
	}
	port, err := freeport.Pick()
	if err != nil {
		return nil, fmt.Errorf("picking a port for %s's shoot kube-apiserver: %w", c.Identity, err)
	}
	host := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := []string{
		"--etcd-cafile=" + etcdClient.CAFile,
		"--etcd-certfile=" + etcdClient.CertFile,
		"--etcd-keyfile=" + etcdClient.KeyFile,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + serving.CertFile,
		"--tls-private-key-file=" + serving.KeyFile,
		"--token-auth-file=" + tokensPath,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://" + host,
		"--service-account-key-file=" + saPath,
		"--service-account-signing-key-file=" + saPath,
		// Both clusters' kube-apiservers share one etcd: the same range.
		"--service-cluster-ip-range=10.96.0.0/16",
		// A shoot's kube-apiserver does not keep the "kubernetes"
		// Service's endpoints (Gardener does), and two servers advertising
		// the same address would rewrite them in turn.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
	return &shootAPIServer{
		Name: c.Identity,
		Config: &rest.Config{
			Host:            "https://" + host,
			BearerToken:     adminToken,
			TLSClientConfig: rest.TLSClientConfig{CAData: e.CA.CertPEM()},
		},
		cluster: c, env: e, dir: dir, logPath: filepath.Join(dir, "kube-apiserver.log"), args: args,
	}, nil
}

// start runs the kube-apiserver with etcdServers as its --etcd-servers and
// places its process in its cluster's WAN site before it can dial. It
// returns once the process runs; the server serves once its etcd does
// (apiload probes /readyz).
func (k *shootAPIServer) start(etcdServers []string) error {
	bin, err := testbin.KubeAPIServer()
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cmd != nil {
		return fmt.Errorf("the shoot kube-apiserver of %s was started already", k.Name)
	}
	logf, err := os.OpenFile(k.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = logf.Close() }() // the child holds its own copy
	args := append([]string{"--etcd-servers=" + strings.Join(etcdServers, ",")}, k.args...)
	_, _ = fmt.Fprintf(logf, "--- %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	// A hostname of its own, as its pod has: kube-apiserver names its
	// identity lease after the hostname, and the two servers share one
	// etcd. sh sets it in a UTS namespace of the process's own, then execs
	// kube-apiserver in place (the pid stays the one the WAN knows).
	cmd := exec.Command("/bin/sh", append([]string{"-c", `hostname "$SHOOT_HOSTNAME" && exec "$@"`, "sh", bin}, args...)...)
	cmd.Env = append(os.Environ(), "SHOOT_HOSTNAME=shoot-kube-apiserver-"+k.Name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUTS}
	cmd.Dir = k.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, and SIGKILL when this process dies, also by
	// a panic that skips every cleanup.
	if err := childproc.Start(cmd); err != nil {
		return fmt.Errorf("starting the shoot kube-apiserver of %s (in a UTS namespace of its own, which needs root): %w", k.Name, err)
	}
	wan := k.env.WAN
	wan.RegisterProcess(cmd.Process.Pid, k.cluster.Site)
	k.cmd, k.done, k.etcdServers = cmd, make(chan struct{}), slices.Clone(etcdServers)
	done := k.done
	go func() {
		err := cmd.Wait()
		wan.UnregisterProcess(cmd.Process.Pid)
		k.mu.Lock()
		k.waitErr = err
		k.mu.Unlock()
		close(done)
	}()
	k.env.shoots.add(k)
	return nil
}

// exited is closed once the process has ended; nil before start.
func (k *shootAPIServer) exited() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.done
}

// started tells whether start ran the process.
func (k *shootAPIServer) started() bool { return k.exited() != nil }

// exitError describes the process's end, with the tail of its log.
func (k *shootAPIServer) exitError() error {
	k.mu.Lock()
	err := k.waitErr
	k.mu.Unlock()
	return fmt.Errorf("the shoot kube-apiserver of %s exited (%v); the end of its log %s:\n%s", k.Name, err, k.logPath, logTail(k.logPath, 15))
}

// stop ends the kube-apiserver, as gardenlet stops a control plane's: a
// SIGTERM, then SIGKILL after shootStopGrace or when ctx ends. It waits
// until the process is gone; stopping one that never started or has ended
// does nothing.
func (k *shootAPIServer) stop(ctx context.Context) error {
	k.mu.Lock()
	cmd, done := k.cmd, k.done
	k.mu.Unlock()
	if cmd == nil {
		return nil
	}
	defer k.env.shoots.remove(k)
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	grace := time.NewTimer(shootStopGrace)
	defer grace.Stop()
	select {
	case <-done:
		return nil
	case <-grace.C:
	case <-ctx.Done():
	}
	_ = cmd.Process.Kill()
	<-done
	return fmt.Errorf("the shoot kube-apiserver of %s was killed: it had not ended %s after SIGTERM, or the wait was cut short", k.Name, shootStopGrace)
}

// untilExit is ctx, also ended (with the process's exit as its cause) when
// the kube-apiserver exits.
func (k *shootAPIServer) untilExit(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := k.exited()
	if done == nil {
		return ctx, func() { cancel(nil) }
	}
	go func() {
		select {
		case <-done:
			cancel(k.exitError())
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}

// logTail is the last n lines of the file at path.
func logTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read it: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// shootSet are the shoot kube-apiservers running, so that Env.Close ends
// whatever a Rehearse left running.
type shootSet struct {
	mu      sync.Mutex
	running map[*shootAPIServer]struct{}
}

func newShootSet() *shootSet { return &shootSet{running: map[*shootAPIServer]struct{}{}} }

func (s *shootSet) add(k *shootAPIServer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running[k] = struct{}{}
}

func (s *shootSet) remove(k *shootAPIServer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.running, k)
}

// stopAll stops every shoot kube-apiserver still running.
func (s *shootSet) stopAll() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	all := make([]*shootAPIServer, 0, len(s.running))
	for k := range s.running {
		all = append(all, k)
	}
	s.mu.Unlock()
	var errs []error
	for _, k := range all {
		errs = append(errs, k.stop(context.Background()))
	}
	return errors.Join(errs...)
}

// servingMembers are the client URLs (the WAN fronts, as the Env's own
// client reaches them) of the Etcd's voters in cluster c whose readiness
// passes: what c's etcd client Service would list now. A learner is left
// out, as a Service leaves out a pod that is not ready: it refuses writes
// with "rpc not supported for learner", which an etcd client does not
// retry for a write.
func (e *Env) servingMembers(ctx context.Context, c *Cluster) ([]string, error) {
	voters, err := e.observedVoters(ctx)
	if err != nil {
		return nil, err
	}
	var urls []string
	for _, v := range voters {
		if e.SideOf(v.Name) != c.Name {
			continue
		}
		m := c.Runner.Runtime().Member(v.Name)
		if m == nil || !m.Running() {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, readyProbeTimeout)
		ready := m.WaitReady(pctx) == nil
		cancel()
		if ready {
			urls = append(urls, m.ClientURL)
		}
	}
	slices.Sort(urls)
	return urls, nil
}
