// Package localetcd runs real etcd members as child processes on 127.0.0.1.
// It stands in for the pods of druid's StatefulSet in the tests, the demo and
// the benchmarks: each member has its own ports, data dir, log file and,
// optionally, TLS certificates, a sidecar HTTP server and WAN-emulated links.
//
// Every process it starts dies with the process that started it (own process
// group, parent-death signal SIGKILL), and Runtime.Close ends everything the
// runtime started, so a test failure, a panic or a Ctrl-C leaves nothing behind.
package localetcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/testing/linkemu"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// Options configure a Runtime.
type Options struct {
	// Dir is the parent of every member's data dir, log file and certificates
	// (t.TempDir() in tests). Required.
	Dir string
	// EtcdBinary is the etcd executable; default testbin.Etcd().
	EtcdBinary string
	// HeartbeatInterval is etcd's --heartbeat-interval; default 100ms.
	HeartbeatInterval time.Duration
	// ElectionTimeout is etcd's --election-timeout; default 1s. etcd wants it
	// at least five heartbeats.
	ElectionTimeout time.Duration
	// CA, when set, turns on TLS: peer and client URLs are https with client
	// certificate authentication, each member gets a certificate issued from
	// the CA, and sidecars serve HTTPS verifying client certificates.
	CA *pki.CA
	// WAN, when set, puts each member's peer and client ports behind
	// WAN.Front(member site, real port); the advertised URLs are the fronts.
	WAN *linkemu.WAN
	// Sidecar, when set, builds the HTTP handler served beside each member on
	// its own port (Member.SidecarURL) from the member's first start until
	// Runtime.Close, like a sidecar container that outlives restarts of the
	// etcd container. A handler that is an io.Closer is closed by Close.
	Sidecar func(m *Member) (http.Handler, error)
	// Logger receives the runtime's own events (start, stop, exit).
	Logger logr.Logger
}

// ClusterState is etcd's --initial-cluster-state.
type ClusterState string

const (
	// ClusterStateNew bootstraps a new cluster together with the other
	// members named in the initial cluster.
	ClusterStateNew ClusterState = "new"
	// ClusterStateExisting joins a cluster that already lists the member
	// (after a MemberAdd).
	ClusterStateExisting ClusterState = "existing"
)

// MemberOptions configure one member.
type MemberOptions struct {
	// Site names the member's location (its "Kubernetes cluster"); with a WAN
	// it selects the delays and partitions that apply to its traffic.
	Site string
	// ExtraArgs are appended to etcd's command line; a flag given here wins
	// over the runtime's own (for example --snapshot-count=100).
	ExtraArgs []string
}

// ErrPortInUse marks a failure to start because one of a member's ports was
// taken by another process.
var ErrPortInUse = errors.New("port in use")

// errClosed is returned by calls on a closed Runtime.
var errClosed = errors.New("localetcd runtime is closed")

// Runtime owns a set of local etcd members and everything started for them.
type Runtime struct {
	opts  Options
	log   logr.Logger
	token string // --initial-cluster-token, unique per runtime

	mu      sync.Mutex
	closed  bool
	members map[string]*Member
	order   []*Member
	clients []*clientv3.Client
}

// New checks the options (the etcd binary above all) and returns an empty
// runtime. Close it, typically from t.Cleanup.
func New(opts Options) (*Runtime, error) {
	if opts.Dir == "" {
		return nil, errors.New("localetcd: Options.Dir is required (the parent of data dirs, logs and certificates)")
	}
	if opts.EtcdBinary == "" {
		bin, err := testbin.Etcd()
		if err != nil {
			return nil, fmt.Errorf("localetcd: %w", err)
		}
		opts.EtcdBinary = bin
	} else if err := checkExecutable(opts.EtcdBinary); err != nil {
		return nil, fmt.Errorf("localetcd: %w", err)
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 100 * time.Millisecond
	}
	if opts.ElectionTimeout == 0 {
		opts.ElectionTimeout = time.Second
	}
	if opts.HeartbeatInterval < time.Millisecond || opts.ElectionTimeout < 5*opts.HeartbeatInterval {
		return nil, fmt.Errorf("localetcd: election timeout %v must be at least five heartbeat intervals (%v) and the heartbeat at least 1ms, as etcd requires",
			opts.ElectionTimeout, opts.HeartbeatInterval)
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("localetcd: creating %s: %w", opts.Dir, err)
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	token := make([]byte, 6)
	if _, err := rand.Read(token); err != nil {
		return nil, err
	}
	return &Runtime{
		opts:    opts,
		log:     opts.Logger.WithName("localetcd"),
		token:   "localetcd-" + hex.EncodeToString(token),
		members: map[string]*Member{},
	}, nil
}

func checkExecutable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("etcd binary not found at %s: run hack/test-binaries.sh (or make test-binaries) to build it", path)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("etcd at %s is not an executable file: run hack/test-binaries.sh (or make test-binaries) to build it", path)
	}
	return nil
}

// validName keeps member names usable as etcd names and as folder names.
var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// NewMember reserves a member's ports, URLs, folder and (with a CA) its
// certificates. It does not start etcd.
func (r *Runtime) NewMember(name string, opts MemberOptions) (*Member, error) {
	if !validName.MatchString(name) {
		return nil, fmt.Errorf("localetcd: member name %q is invalid: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	if r.opts.WAN != nil && opts.Site == "" {
		return nil, fmt.Errorf("localetcd: member %q needs a Site when the runtime has a WAN", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errClosed
	}
	if _, ok := r.members[name]; ok {
		return nil, fmt.Errorf("localetcd: a member named %q already exists in this runtime", name)
	}
	dir := filepath.Join(r.opts.Dir, name)
	m := &Member{
		Name:    name,
		Site:    opts.Site,
		DataDir: filepath.Join(dir, "data"),
		LogPath: filepath.Join(dir, "etcd.log"),
		r:       r,
		extra:   append([]string(nil), opts.ExtraArgs...),
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("localetcd: creating %s: %w", dir, err)
	}
	if r.opts.CA != nil {
		if err := m.issueCertificate(filepath.Join(dir, "tls")); err != nil {
			return nil, err
		}
	}
	if err := m.reserveEndpoints(); err != nil {
		return nil, err
	}
	r.members[name] = m
	r.order = append(r.order, m)
	return m, nil
}

// Member returns the member of that name, or nil.
func (r *Runtime) Member(name string) *Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.members[name]
}

// Members returns every member of the runtime in creation order.
func (r *Runtime) Members() []*Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Member(nil), r.order...)
}

// forget drops a member that never became part of a cluster, so a caller
// can try again under the same name.
func (r *Runtime) forget(m *Member) {
	m.releaseEndpoints()
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.members, m.Name)
	for i, o := range r.order {
		if o == m {
			r.order = append(r.order[:i], r.order[i+1:]...)
			break
		}
	}
}

// InitialCluster renders etcd's --initial-cluster for the members:
// "name=peerURL,...".
func InitialCluster(members ...*Member) string {
	parts := make([]string, len(members))
	for i, m := range members {
		parts[i] = m.Name + "=" + m.PeerURL
	}
	return strings.Join(parts, ",")
}

// startAttempts bounds the retries after a port clash, which only happens
// when another process grabs a port in the instant between its release and
// etcd's bind.
const startAttempts = 3

// StartCluster bootstraps a new cluster of members with the given names,
// all with the same options, and returns once every member is ready.
func (r *Runtime) StartCluster(ctx context.Context, names []string, opts MemberOptions) ([]*Member, error) {
	if len(names) == 0 {
		return nil, errors.New("localetcd: StartCluster needs at least one member name")
	}
	members := make([]*Member, 0, len(names))
	for _, n := range names {
		m, err := r.NewMember(n, opts)
		if err != nil {
			for _, made := range members {
				r.forget(made)
			}
			return nil, err
		}
		members = append(members, m)
	}
	if err := r.StartMembers(ctx, members...); err != nil {
		for _, m := range members {
			r.forget(m)
		}
		return nil, err
	}
	return members, nil
}

// StartMembers bootstraps a new cluster from members created with NewMember
// (for instance in different sites) and returns once every one is ready. On
// failure none of them is left running.
func (r *Runtime) StartMembers(ctx context.Context, members ...*Member) error {
	if len(members) == 0 {
		return errors.New("localetcd: StartMembers needs at least one member")
	}
	for attempt := 1; ; attempt++ {
		err := r.startTogether(ctx, members)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrPortInUse) || attempt == startAttempts || ctx.Err() != nil {
			return err
		}
		r.log.Info("port clash while bootstrapping, retrying on new ports", "attempt", attempt, "error", err.Error())
		for _, m := range members {
			if err := m.resetForRetry(); err != nil {
				return err
			}
		}
	}
}

// startTogether starts all members at once: none of a new cluster's members
// is ready before a quorum of them runs.
func (r *Runtime) startTogether(ctx context.Context, members []*Member) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ic := InitialCluster(members...)
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Go(func() {
			if errs[i] = m.Start(ctx, ic, ClusterStateNew); errs[i] != nil {
				cancel() // the others would wait for a quorum that may never come
			}
		})
	}
	wg.Wait()
	var first error
	for _, err := range errs {
		if err != nil && (first == nil || errors.Is(first, context.Canceled)) {
			first = err // prefer the cause over the cancellations it caused
		}
	}
	if first == nil {
		return nil
	}
	for _, m := range members {
		_ = m.Kill()
	}
	return first
}

// JoinAsLearner adds a new member as a learner through the running members
// via (never through the new member itself), then starts it with
// --initial-cluster-state=existing and waits until it serves clients. A
// member that catches up by snapshot may take 9-19 s, so give ctx room. On
// failure the learner is removed from the cluster again and nothing of it
// is left running.
func (r *Runtime) JoinAsLearner(ctx context.Context, name string, opts MemberOptions, via ...*Member) (*Member, error) {
	if len(via) == 0 {
		return nil, fmt.Errorf("localetcd: JoinAsLearner(%q) needs at least one running member to add it through", name)
	}
	m, err := r.NewMember(name, opts)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		err = r.joinOnce(ctx, m, via)
		if err == nil {
			return m, nil
		}
		if !errors.Is(err, ErrPortInUse) || attempt == startAttempts || ctx.Err() != nil {
			break
		}
		r.log.Info("port clash while joining, retrying on new ports", "member", name, "attempt", attempt, "error", err.Error())
		if err = m.resetForRetry(); err != nil {
			break
		}
	}
	r.forget(m)
	return nil, err
}

func (r *Runtime) joinOnce(ctx context.Context, m *Member, via []*Member) error {
	endpoints := make([]string, len(via))
	for i, v := range via {
		endpoints[i] = v.ClientURL
	}
	cli, err := newClient(endpoints, via[0].ClientTLSConfig())
	if err != nil {
		return fmt.Errorf("localetcd: client for adding %q: %w", m.Name, err)
	}
	defer func() { _ = cli.Close() }()

	resp, err := cli.MemberAddAsLearner(ctx, []string{m.PeerURL})
	if err != nil {
		return fmt.Errorf("localetcd: adding %q (%s) as learner through %s: %w", m.Name, m.PeerURL, strings.Join(endpoints, ","), err)
	}
	var ic []string
	for _, pm := range resp.Members {
		n := pm.Name
		if pm.ID == resp.Member.ID {
			n = m.Name // a member that has not started yet has no name in the list
		}
		for _, u := range pm.PeerURLs {
			ic = append(ic, n+"="+u)
		}
	}
	startErr := m.Start(ctx, strings.Join(ic, ","), ClusterStateExisting)
	if startErr == nil {
		return nil
	}
	// Undo the add so that a failed join leaves the cluster as it was; the
	// caller's ctx may be the reason we failed, so do not depend on it.
	rmCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := cli.MemberRemove(rmCtx, resp.Member.ID); err != nil {
		return errors.Join(startErr, fmt.Errorf("localetcd: removing the failed learner %q (id %x) again: %w", m.Name, resp.Member.ID, err))
	}
	return startErr
}

// Close ends every etcd process, sidecar server, WAN front and client the
// runtime started. It is safe to call more than once.
func (r *Runtime) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	members := append([]*Member(nil), r.order...)
	clients := r.clients
	r.clients = nil
	r.mu.Unlock()

	var errs []error
	for _, c := range clients {
		_ = c.Close() // a client whose member died reports that here; not our concern
	}
	for _, m := range members {
		errs = append(errs, m.stopSidecar())
		if err := m.Kill(); err != nil {
			errs = append(errs, err)
		}
		m.releaseEndpoints()
	}
	return errors.Join(errs...)
}

// track registers a client for Close; it refuses when Close already ran.
func (r *Runtime) track(c *clientv3.Client) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errClosed
	}
	r.clients = append(r.clients, c)
	return nil
}

func (r *Runtime) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}
