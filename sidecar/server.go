// Package sidecar is the membership sidecar that runs beside each etcd member
// (like etcd-backup-restore) and its Go client. The server exposes etcd's
// membership operations over HTTPS with the safety checks the controller
// relies on: idempotent answers, a quorum projection before every removal, a
// learner readiness rule before every promotion, a fingerprint of the
// membership a change was planned from, and a membership lock kept in etcd
// itself so that only one controller changes membership at a time.
//
// Endpoints (JSON in and out; errors are {"reason","message","retryAfterSeconds"}):
//
//	GET    /v1/members                 member list, health, leader, fingerprint, lock
//	POST   /v1/members                 add a learner {"name","peerURLs","learner":true}
//	POST   /v1/members/{name}/promote  promote a learner; ?thenRemove={name} removes that voter right after (the tie of a move)
//	DELETE /v1/members/{name}          remove a member
//	POST   /v1/leader                  move leadership {"name"}
//	POST   /v1/lock                    acquire, renew or take over the lock {"holder","token","ttlSeconds"}
//	DELETE /v1/lock                    release the lock (headers X-Druid-Stretch-Lock-Holder and -Token)
//	PUT    /v1/retired/{name}          record that a holder retired a member {"by"}
//	DELETE /v1/retired/{name}          drop a retirement record (see retired.go)
//	GET    /v1/join                    with Config.Joining: whether the local member waits for an admission (join.go)
//	PUT    /v1/join                    admit it {"state","initialCluster","memberID"}
//	GET    /initialization/*, /config  with Config.Joining: etcd-wrapper's protocol, in place of backup-restore's
//	GET    /healthz, /readyz, /metrics
//
// {name} is a member name, or the hex member ID for a learner that has not
// started (etcd names a member only once it starts).
//
// Every /v1/ call needs a client certificate verified against the client CA
// (401 Unauthorized otherwise), and a mutating one a certificate whose
// identity Config.AllowedClients lists (403 Forbidden otherwise); the caller
// is named by its certificate only, never by a header (access.go).
// Config.InsecureAllowUnauthenticated (plain HTTP) is for tests on one
// machine. Request bodies, requests in flight and the server's timeouts are
// bounded (Limits). Mutating calls may carry X-Druid-Stretch-Membership
// (the fingerprint planned from; 409 MembershipChanged when etcd's differs)
// and X-Druid-Stretch-Lock-Holder with X-Druid-Stretch-Lock-Token (409
// LockHeld, LockNotHeld, StaleToken or LockExpiring unless that holder's
// process holds the lock). Every change is recorded in etcd before it is
// sent, in a transaction on the lock (fence.go): the lock is a fence. Without
// the lock headers the lock is not checked, so an operator can still act
// with curl (a change in flight still holds theirs off); the controller
// always sends them. The client gate's calls (/v1/clients/drain and
// /v1/clients/hold) require them: only the lock's holder keeps a member's
// clients away or waiting. A call
// whose effect is already in place answers success with "changed": false
// even with a stale fingerprint, since it changes nothing (the lock is still
// checked). Membership changes go through one at a time per sidecar.
package sidecar

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/druid-stretch/druid-stretch/internal/clientgate"
	"github.com/druid-stretch/druid-stretch/internal/tlsfiles"
)

// Config configures a sidecar Server.
type Config struct {
	// Endpoints are etcd client URLs. The first is the local member (the
	// one this sidecar runs beside; readyz probes it). Further endpoints
	// are used when the local member cannot serve membership calls, as a
	// learner cannot; once a member list was read, the voters' client URLs
	// are used for that.
	Endpoints []string
	// EtcdTLS is the TLS client configuration for etcd; nil for plain
	// http:// endpoints.
	EtcdTLS *tls.Config
	// ClientCAs, when set, verifies the caller's client certificate in the
	// handler itself, for a host server (e.g. etcd-backup-restore's) whose
	// TLS configuration trusts other CAs too. Without it the handler relies
	// on the TLS server's verification (tls.VerifyClientCertIfGiven).
	ClientCAs *x509.CertPool
	// AllowedClients are the client identities (a certificate's common
	// name, DNS or URI SAN, or email SAN) that may change membership, once
	// the certificate verified against the client CA. Empty lets every
	// certificate of that CA change membership (a library default for
	// tests; the sidecar command and the webhook always set it). Read calls
	// (GET /v1/...) need a verified certificate but no listed identity.
	AllowedClients []string
	// InsecureAllowUnauthenticated lets every call through without a
	// client certificate: plain HTTP, for tests on one machine only
	// (--insecure-http).
	InsecureAllowUnauthenticated bool
	// Limits bound what one caller can make the sidecar hold: request
	// sizes, requests in flight and the HTTP server's timeouts.
	Limits Limits
	// MinLearnerHealthy is how long etcd's strict reconfiguration check
	// needs a member connected to the local member's raft transport (or
	// healthy) before it counts it for a removal (default 5 s, etcd's
	// HealthInterval). A promotion waits for it only when the removal sent
	// with it (thenRemove) needs the new voter counted; etcd itself puts
	// no time on a promotion.
	MinLearnerHealthy time.Duration
	// MaxLearnerLag is how many raft entries a learner may be behind the
	// leader and still count as caught up (default 1000). etcd's own check
	// (90 % of the leader's index) still applies after this one.
	MaxLearnerLag uint64
	// StatusTimeout bounds each member health poll (default 1 s).
	StatusTimeout time.Duration
	// RequestTimeout bounds each etcd call made for a request (default 10 s).
	RequestTimeout time.Duration
	// PollInterval is how often members are polled in the background so
	// that HealthyForSeconds means "without interruption" (default 1 s;
	// negative disables background polling).
	PollInterval time.Duration
	// TombstoneTTL is how long a member whose removal was sent stays
	// unpolled (default 60 s).
	TombstoneTTL time.Duration
	// RemovalGrace is how long a removal waits after writing its tombstone
	// before it is sent, so that status polls that read the tombstones just
	// before the write have started (default 300 ms; etcd issue 21966).
	RemovalGrace time.Duration
	// Registry receives the sidecar's metrics and is served on /metrics;
	// nil creates a fresh one.
	Registry *prometheus.Registry
	// Logger receives one structured line per mutating call.
	Logger logr.Logger
	// ClientGate, when set, is the gate in front of the local member's
	// client port (internal/clientgate): the sidecar drains and holds the
	// member's clients through it (POST /v1/clients/drain,
	// /v1/clients/hold) and is not ready once it drained. The caller serves
	// and closes it.
	ClientGate *clientgate.Gate
	// Joining, when set, also makes the sidecar the server etcd-wrapper
	// asks for initialisation and configuration (see join.go): its member
	// starts only once druid-stretch admitted it.
	Joining *Joining
	// DialContext, when set, opens the sidecar's connections to etcd
	// (tests place an in-process sidecar in its emulated network site with
	// it); nil dials directly.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (c *Config) setDefaults() {
	if c.MinLearnerHealthy == 0 {
		c.MinLearnerHealthy = 5 * time.Second
	}
	if c.MaxLearnerLag == 0 {
		c.MaxLearnerLag = 1000
	}
	if c.StatusTimeout == 0 {
		c.StatusTimeout = time.Second
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 10 * time.Second
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.TombstoneTTL == 0 {
		c.TombstoneTTL = time.Minute
	}
	if c.RemovalGrace == 0 {
		c.RemovalGrace = 300 * time.Millisecond
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	c.Limits.setDefaults(c.RequestTimeout)
}

// Server is the sidecar: an http.Handler over one etcd cluster.
type Server struct {
	cfg     Config
	log     logr.Logger
	metrics *metrics
	mux     *http.ServeMux
	local   *clientv3.Client
	joiner  *joiner // nil unless Config.Joining is set

	// inFlight holds a token per /v1/ call being answered (Limits.MaxInFlight).
	inFlight chan struct{}

	// mutations serializes the membership calls handled by this sidecar, so
	// that each one checks and acts on a membership no sibling call is
	// changing. Across sidecars the membership lock does this.
	mutations sync.Mutex
	// recordsClosing counts the step records being closed (fence.go).
	recordsClosing sync.WaitGroup

	mu           sync.Mutex
	closed       bool
	localID      uint64
	localLearner bool
	// localLed: the latest observation found the local member leading;
	// only then does a poll read its raft progress (readRaftProgress).
	localLed      bool
	peers         *clientv3.Client // voters other than the local member
	peerEndpoints []string
	memberConns   map[uint64]*memberConn
	healthySince  map[uint64]time.Time
	lastHealthy   map[uint64]time.Time // member ID -> the last poll that found it healthy
	removalsSent  map[uint64]time.Time // member ID -> until when it stays unpolled
	tombstones    tombstoneLease
	// hold is the client gate's hold put in force through the API; nil
	// once it ended.
	hold *apiHold
	// drain is the lease of the gate's drain in force (clients.go); nil
	// for none. drainCalls serializes the calls that drain, renew and
	// undo it, and the observations that end it.
	drain      *drainLease
	drainCalls sync.Mutex
	// drainMark is the lease of this member's drain mark in etcd
	// (drainMarkPrefix); 0 without one.
	drainMark clientv3.LeaseID
	// transport is the local member's raft transport as its metrics
	// showed it (transport.go), read with metricsClient.
	transport     transportView
	metricsClient *http.Client
	// fenceHooks run around the fence's transaction; tests set them
	// (export_test.go) to change the lock between a check and the fence.
	fenceHooks struct{ before, after func() }

	// background ends at Close: the sidecar's own goroutines (the health
	// poll, a hold's watch for the new leader) stop with it.
	background  context.Context
	stopPolling context.CancelFunc
	pollingDone chan struct{}
	// watchers are the goroutines that watch etcd until background ends
	// (handoff.go).
	watchers sync.WaitGroup
}

// tombstoneLease is the lease this sidecar attaches its tombstones to.
type tombstoneLease struct {
	id      clientv3.LeaseID
	granted time.Time
}

// New connects to etcd (lazily: etcd need not be up yet) and starts the
// background health polling.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("sidecar: no etcd endpoints configured")
	}
	if cfg.MinLearnerHealthy < 0 {
		return nil, fmt.Errorf("sidecar: MinLearnerHealthy %s is negative", cfg.MinLearnerHealthy)
	}
	var j *joiner
	if cfg.Joining != nil {
		var err error
		if j, err = newJoiner(*cfg.Joining); err != nil {
			return nil, err
		}
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	local, err := newEtcdClient(cfg.Endpoints[:1], &cfg)
	if err != nil {
		return nil, fmt.Errorf("sidecar: connecting to the local etcd member %s: %w", cfg.Endpoints[0], err)
	}
	s := &Server{
		cfg:           cfg,
		log:           cfg.Logger,
		metrics:       m,
		local:         local,
		joiner:        j,
		memberConns:   map[uint64]*memberConn{},
		healthySince:  map[uint64]time.Time{},
		lastHealthy:   map[uint64]time.Time{},
		removalsSent:  map[uint64]time.Time{},
		metricsClient: newMetricsClient(&cfg),
		peerEndpoints: append([]string(nil), cfg.Endpoints[1:]...),
		inFlight:      make(chan struct{}, cfg.Limits.MaxInFlight),
	}
	if len(s.peerEndpoints) > 0 {
		if s.peers, err = newEtcdClient(s.peerEndpoints, &cfg); err != nil {
			_ = local.Close()
			return nil, fmt.Errorf("sidecar: connecting to etcd %v: %w", s.peerEndpoints, err)
		}
	}
	if err := cfg.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "druid_stretch", Subsystem: "sidecar", Name: "requests_in_flight",
		Help: "/v1/ calls being answered, bounded by the sidecar's in-flight limit.",
	}, func() float64 { return float64(len(s.inFlight)) })); err != nil {
		_ = local.Close()
		if s.peers != nil {
			_ = s.peers.Close()
		}
		return nil, fmt.Errorf("registering sidecar metrics: %w", err)
	}
	s.routes()
	ctx, cancel := context.WithCancel(context.Background())
	s.background, s.stopPolling, s.pollingDone = ctx, cancel, make(chan struct{})
	go s.pollHealth(ctx)
	if cfg.ClientGate != nil {
		s.watchers.Add(1)
		go func() { defer s.watchers.Done(); s.watchHandoffs(ctx) }()
	}
	return s, nil
}

// Handler serves the sidecar's endpoints under absolute paths (/v1/...,
// /healthz, /readyz, /metrics), so it can be mounted into another mux
// (etcd-backup-restore's has its own /healthz and /metrics: mount /v1/ only).
func (s *Server) Handler() http.Handler { return s.mux }

// ServeHTTP makes the Server itself a handler, so that code which closes
// handlers that are io.Closers closes it too.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close stops polling and closes every etcd connection. It is safe to call
// more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	// Records of changes that were answered get their outcome first.
	s.recordsClosing.Wait()
	s.stopPolling()
	<-s.pollingDone
	s.watchers.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := []error{s.local.Close()}
	if s.peers != nil {
		errs = append(errs, s.peers.Close())
	}
	for id, c := range s.memberConns {
		errs = append(errs, c.client.Close())
		delete(s.memberConns, id)
	}
	// The poll has stopped, so no metrics read is in flight: the idle
	// connection to the member's /metrics is the last one left.
	s.metricsClient.CloseIdleConnections()
	return ignoreCanceled(errors.Join(errs...))
}

// Serve answers on l until ctx ends, over TLS when tlsConfig is set, then
// shuts down gracefully. It does not close the Server.
func (s *Server) Serve(ctx context.Context, l net.Listener, tlsConfig *tls.Config) error {
	srv := s.cfg.Limits.HTTPServer(s.Handler())
	if tlsConfig != nil {
		l = tls.NewListener(l, tlsConfig)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("sidecar: serving on %s: %w", l.Addr(), err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("sidecar: shutting down: %w", err)
	}
	return nil
}

// ServerTLSConfig is the sidecar's server TLS: its certificate, and client
// certificates verified against clientCAFile. The handshake accepts a
// caller without a certificate, so that the kubelet's probes (/healthz,
// /readyz) work; every /v1/ call then answers 401. The files are watched
// until ctx ends (tlsfiles.Server): a certificate or client CA that the
// Etcd's Secret renews applies from the next handshake on, with no restart.
func ServerTLSConfig(ctx context.Context, certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	if clientCAFile == "" {
		return nil, errors.New("the sidecar's server TLS needs a client CA: only callers with a certificate of it may change membership")
	}
	return tlsfiles.Server(ctx, certFile, keyFile, clientCAFile, tls.VerifyClientCertIfGiven)
}

// EtcdClientTLSConfig is a TLS client configuration for etcd from
// etcd-backup-restore's flags (--cacert, --cert, --key,
// --insecure-skip-tls-verify); every file is optional.
func EtcdClientTLSConfig(caFile, certFile, keyFile string, insecureSkipVerify bool) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecureSkipVerify} //nolint:gosec // an explicit operator flag
	if caFile != "" {
		pool, err := loadCertPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("etcd client certificate %q and key %q must be given together", certFile, keyFile)
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("loading the etcd client certificate %s and key %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func loadCertPool(file string) (*x509.CertPool, error) {
	pemBytes, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// memberReconnect bounds how long a member client waits between two dials.
// gRPC's default backoff grows to minutes: a member whose client port
// refused connections while it joined (20 s and more at 180 ms RTT) was
// seen serving up to 7 s after it opened, and every change waited for it
// as an unhealthy voter meanwhile.
var memberReconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 5 * time.Second,
}

func newEtcdClient(endpoints []string, cfg *Config) (*clientv3.Client, error) {
	dial := []grpc.DialOption{grpc.WithConnectParams(memberReconnect)}
	if d := cfg.DialContext; d != nil {
		dial = append(dial, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d(ctx, "tcp", addr)
		}))
	}
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		TLS:         cfg.EtcdTLS,
		DialOptions: dial,
		// The sidecar logs its own outcomes; the client's retry chatter
		// about unreachable members would drown them.
		Logger: zap.NewNop(),
		// Bounded so that a request against a dead member fails within
		// RequestTimeout instead of retrying its whole budget.
		MaxUnaryRetries: 2,
	})
}

func (s *Server) routes() {
	mux := http.NewServeMux()
	s.handle(mux, "GET /v1/members", "", false, s.listMembers)
	s.handle(mux, "POST /v1/members", "add_learner", true, s.addLearner)
	s.handle(mux, "POST /v1/members/{name}/promote", "promote", true, s.promote)
	s.handle(mux, "DELETE /v1/members/{name}", "remove", true, s.remove)
	s.handle(mux, "POST /v1/leader", "move_leader", true, s.moveLeader)
	s.handle(mux, "POST /v1/lock", "acquire_lock", true, s.acquireLock)
	s.handle(mux, "DELETE /v1/lock", "release_lock", true, s.releaseLock)
	s.handle(mux, "PUT /v1/retired/{name}", "retire", true, s.retire)
	s.handle(mux, "DELETE /v1/retired/{name}", "unretire", true, s.unretire)
	s.clientRoutes(mux)
	s.handle(mux, "GET /healthz", "", false, func(*http.Request) (int, any, *Error) {
		return http.StatusOK, map[string]string{"status": "ok"}, nil
	})
	s.handle(mux, "GET /readyz", "", false, s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}))
	if s.joiner != nil {
		s.joinRoutes(mux)
	}
	s.handle(mux, "/", "", false, func(r *http.Request) (int, any, *Error) {
		return 0, nil, &Error{StatusCode: http.StatusNotFound, Reason: ReasonNotFound,
			Message: fmt.Sprintf("no endpoint %s %s; see the sidecar package documentation for the API", r.Method, r.URL.Path)}
	})
	s.mux = mux
}

// handlerFunc answers a request with a status and a JSON body, or an Error.
type handlerFunc func(r *http.Request) (int, any, *Error)

// callInfo collects what a handler learned about a call, for its log line.
type callInfo struct{ target string }

type callInfoKey struct{}

func setTarget(r *http.Request, target string) {
	if ci, ok := r.Context().Value(callInfoKey{}).(*callInfo); ok {
		ci.target = target
	}
}

// handle wraps h with authentication and authorization (every /v1/ call),
// the request limits, the JSON answer, metrics and a log line per mutating
// call. Probes and the catch-all answer without a certificate.
func (s *Server) handle(mux *http.ServeMux, pattern, operation string, mutating bool, h handlerFunc) {
	_, path, _ := strings.Cut(pattern, " ")
	api := strings.HasPrefix(path, "/v1/")
	mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ci := &callInfo{target: r.PathValue("name")}
		r = r.WithContext(context.WithValue(r.Context(), callInfoKey{}, ci))
		var (
			status int
			body   any
			apiErr *Error
			caller string
		)
		if !api {
			status, body, apiErr = h(r)
		} else if caller, apiErr = s.authorize(r, mutating); apiErr == nil {
			status, body, apiErr = s.withinLimits(w, r, h)
		}
		reason := ReasonOK
		if apiErr != nil {
			status, reason = apiErr.StatusCode, apiErr.Reason
			body = errorBody{Reason: apiErr.Reason, Message: apiErr.Message, RetryAfterSeconds: retryAfterSeconds(apiErr.RetryAfter)}
			if apiErr.RetryAfter > 0 {
				w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(apiErr.RetryAfter), 10))
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if err := json.NewEncoder(w).Encode(body); err != nil {
			s.log.V(1).Info("writing the answer failed", "endpoint", pattern, "error", err.Error())
		}
		took := time.Since(start)
		s.metrics.observe(pattern, operation, status, reason, took)
		if mutating {
			kv := []any{"caller", caller, "operation", operation, "target", ci.target, "code", status, "outcome", reason, "durationSeconds", took.Seconds()}
			if apiErr != nil {
				kv = append(kv, "message", apiErr.Message)
			}
			s.log.Info("membership call", kv...)
		}
	})
}

func retryAfterSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// readyz answers whether the local member serves requests. It reads with a
// serializable range (which learners serve too) instead of calling Status,
// because a Status call on a member applying its own removal crashes it
// (etcd issue 21966).
func (s *Server) readyz(r *http.Request) (int, any, *Error) {
	s.mu.Lock()
	_, removing := s.removalsSent[s.localID]
	removing = removing && s.localID != 0
	s.mu.Unlock()
	if removing {
		return 0, nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonNotReady, Message: "the local member is being removed"}
	}
	// A drained member takes no client: not ready, so that its pod leaves
	// the client Service before the member's removal.
	if g := s.cfg.ClientGate; g != nil && !g.Ready() {
		return 0, nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonNotReady, Message: "the local member's clients were drained before its removal"}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StatusTimeout)
	defer cancel()
	resp, err := s.local.Get(ctx, keyPrefix, clientv3.WithSerializable(), clientv3.WithCountOnly())
	if err != nil {
		return 0, nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonNotReady,
			Message: fmt.Sprintf("the local etcd member %s does not answer: %v", s.cfg.Endpoints[0], err)}
	}
	s.noteLocalID(resp.Header.GetMemberId())
	return http.StatusOK, map[string]string{"status": "ok", "memberID": formatID(resp.Header.GetMemberId())}, nil
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
