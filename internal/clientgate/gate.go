// Package clientgate is a gate in front of an etcd member's client port: a
// reverse proxy for etcd's gRPC (HTTP/2) and HTTP/1 API that the
// membership controller can drain before it removes the member, and hold
// shut for the fraction of a second of a leader transfer.
//
// Why: kube-apiserver, the client that matters, does not retry a write
// once it was sent. A write in flight at a member that applies its own
// removal fails ("raft: stopped"), and so does a write that the old leader
// drops during a leader transfer, silently when a follower forwarded it
// (the request then hangs until etcd's request timeout). etcd offers no
// way to move a client elsewhere or to pause proposals. The gate does both
// from outside etcd:
//
//   - Drain stops accepting connections, sends HTTP/2 GOAWAY on every
//     connection (a gRPC client then opens its next calls on another
//     address and keeps the calls it has in flight), waits for the unary
//     calls in flight to finish, then ends the streams (watches, lease
//     keep-alives), which their clients re-establish elsewhere. A member
//     whose gate drained serves nobody and can be removed without a failed
//     request. etcd itself cannot do this when it serves TLS: its graceful
//     stop applies only to plain listeners. A drain is undone by Undrain:
//     the removal it prepared may not come (a failed step, the member
//     became leader), and a member whose gate stays drained serves no
//     client, answers no poll through its client port and cannot be led
//     away from (the sidecar bounds every drain with a lease, so that
//     undoing it does not depend on the controller).
//   - Hold makes new data calls (KV, lease grants) wait, and returns once
//     the proposals already forwarded (writes, compactions, lease grants
//     and revokes) have finished: with every member's gate held, no
//     proposal is in flight toward the old leader during a leader
//     transfer, so none is dropped. Reads in flight are not waited for:
//     etcd does not drop them, it answers a read whose read index the
//     transfer interrupted with "leader changed" (gRPC Unavailable), which
//     etcd's client retries for reads; waiting for them would only delay
//     the transfer by a read's round trip. A hold ends at Release or after
//     its maximum duration, whichever comes first, so a controller that
//     dies mid-transfer stalls clients for that long at most.
//   - The gate listens only while its member serves (a probe of the
//     member's /health, and any call whose connection the member refused):
//     a member that is gone (its etcd stopped, crashed or restarts) has no
//     listener in front of it, so its clients' connections are refused as
//     by the member itself and their balancer moves them to another
//     endpoint, instead of a gate that accepts them and fails their calls.
//     A call that races the member's end and was never sent to it is
//     answered so that etcd's client retries it elsewhere, writes included
//     (notSentStatus).
package clientgate

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
)

// Options configure a Gate.
type Options struct {
	// Backend is the member's own client URL, on loopback (http or https).
	// Required.
	Backend *url.URL
	// ServerTLS, when set, serves TLS to the clients (HTTP/2 through ALPN);
	// else the gate serves plain HTTP/1 and HTTP/2 without TLS (prior
	// knowledge, as gRPC's insecure transport speaks it).
	ServerTLS *tls.Config
	// BackendTLS is the client TLS configuration toward an https Backend.
	BackendTLS *tls.Config
	// ProbeInterval is how often the gate asks its member whether it
	// serves (default 200 ms): the gate listens only while it does.
	ProbeInterval time.Duration
	// Log receives drains, holds and proxy errors.
	Log logr.Logger
}

// Gate is a running gate. It is safe for concurrent use.
type Gate struct {
	o      Options
	proxy  *httputil.ReverseProxy
	probe  *http.Client
	health string // the member's health URL the probe asks

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced on every state change
	inFlight  int           // unary calls forwarded and not yet answered
	proposals int           // of them, proposals (see callKind)
	heldTill  time.Time     // new reads and proposals wait until then, or Release
	hold      uint64        // the current hold, so a stale Release is a no-op
	// drained is true from Drain to Undrain: the gate does not listen.
	drained bool
	// memberDown is true once the member refused a connection or its
	// probe, until it answers a probe again: the gate does not listen.
	memberDown bool
	closed     bool
	// addr is where the gate listens, once Serve or ListenAndServe ran.
	addr string
	// sess is the period the gate listens in; nil while it does not.
	sess *session
	// live are the sessions whose server runs: sess, and those that
	// still send their clients away.
	live map[*session]struct{}
	// wake makes the supervisor (run) look at the state at once.
	wake chan struct{}
}

// session is one period in which the gate listens: an http.Server of its
// own, because a server that was shut down cannot serve again, and a
// drain that is undone, or a member that comes back, opens a new one.
type session struct {
	srv *http.Server
	// listenersClosed is closed once Shutdown has closed the listener
	// (http.Server.RegisterOnShutdown): from then on no new client comes.
	listenersClosed chan struct{}
	closeListeners  sync.Once
	// The fields below are guarded by Gate.mu.
	//
	// conns counts the client connections open (http.Server's ConnState):
	// a drain ends when they are gone, not at Shutdown's next poll of
	// them, which backs off to 500 ms while the clients leave.
	conns int
	// streamsEnded refuses new streaming calls: a stream opened after the
	// drain ended the others would keep the drain waiting.
	streamsEnded bool
	streams      map[*stream]struct{}
}

// stream is a streaming call (a watch, a lease keep-alive): it is not
// counted in flight and ends when the gate drains.
type stream struct{ cancel context.CancelFunc }

// streamingMethods are etcd's gRPC methods that stream: they stay open for
// as long as the client wants, so a drain ends them instead of waiting.
var streamingMethods = map[string]bool{
	"/etcdserverpb.Watch/Watch":          true,
	"/etcdserverpb.Lease/LeaseKeepAlive": true,
	"/etcdserverpb.Maintenance/Snapshot": true,
	"/v3electionpb.Election/Observe":     true,
}

// callKind sorts the unary calls by what a hold does with them.
type callKind int

const (
	// passCall passes a held gate: Cluster and Maintenance calls, so that
	// the membership controller's own calls (status polls, the leader
	// transfer itself) go through.
	passCall callKind = iota
	// readCall waits while a hold is in force; one in flight when the hold
	// begins is not waited for (see the package comment).
	readCall
	// proposalCall waits while a hold is in force, and a hold returns only
	// once none is in flight: these become raft proposals, which the old
	// leader of a transfer drops.
	proposalCall
)

// kindOf tells a unary call's kind from its gRPC method. A KV Txn counts
// as a proposal even when none of its branches writes (etcd serves such a
// Txn through a read index): telling them apart would mean decoding it,
// and kube-apiserver's Txns write.
func kindOf(r *http.Request) callKind {
	if !isGRPC(r) {
		return passCall
	}
	switch m := r.URL.Path; {
	case m == "/etcdserverpb.KV/Range":
		return readCall
	case strings.HasPrefix(m, "/etcdserverpb.KV/"),
		m == "/etcdserverpb.Lease/LeaseGrant", m == "/etcdserverpb.Lease/LeaseRevoke":
		return proposalCall
	}
	return passCall
}

const (
	defaultProbeInterval = 200 * time.Millisecond
	// probeTimeout bounds a probe of the member. A probe that times out
	// changes nothing: a member slow to answer (a starved machine) is not
	// taken for one that is gone.
	probeTimeout = time.Second
)

// New builds a gate; Serve or ListenAndServe runs it.
func New(o Options) (*Gate, error) {
	if o.Backend == nil {
		return nil, errors.New("clientgate: Backend is required")
	}
	if o.Backend.Scheme != "http" && o.Backend.Scheme != "https" {
		return nil, fmt.Errorf("clientgate: Backend %s: the scheme must be http or https", o.Backend)
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = defaultProbeInterval
	}
	g := &Gate{o: o, changed: make(chan struct{}), live: map[*session]struct{}{}, wake: make(chan struct{}, 1)}

	// HTTP/2 toward etcd for gRPC (prior knowledge without TLS), HTTP/1 for
	// the rest (/health, /metrics): etcd serves both on its client port.
	var h2, h1 http.Protocols
	if o.Backend.Scheme == "https" {
		h2.SetHTTP2(true)
	} else {
		h2.SetUnencryptedHTTP2(true)
	}
	h1.SetHTTP1(true)
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	// A config copy per transport: a transport's HTTP/2 setup writes the
	// protocols it offers into its config.
	grpcTransport := &http.Transport{Protocols: &h2, TLSClientConfig: o.BackendTLS.Clone(), DialContext: dialer.DialContext}
	httpTransport := &http.Transport{Protocols: &h1, TLSClientConfig: o.BackendTLS.Clone(), DialContext: dialer.DialContext}
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(o.Backend)
			r.Out.Host = r.In.Host
		},
		Transport: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if isGRPC(r) {
				return grpcTransport.RoundTrip(r)
			}
			return httpTransport.RoundTrip(r)
		}),
		// gRPC answers stream: every frame goes out as it comes. (A unary
		// call's answer is not flushed before it ends: serve.)
		FlushInterval:  -1,
		BufferPool:     copyBuffers{},
		ModifyResponse: statusToTrailers,
		ErrorHandler:   g.proxyError,
		// A stream the gate ended at a drain shows here as a cancelled
		// copy: expected, so at V(1).
		ErrorLog: log.New(logWriter{o.Log.V(1)}, "", 0),
	}
	// The probe keeps one connection open, so that asking costs no
	// handshake: a serializable read on the member itself.
	g.probe = &http.Client{Timeout: probeTimeout, Transport: &http.Transport{Protocols: &h1, TLSClientConfig: o.BackendTLS.Clone(),
		DialContext: dialer.DialContext, MaxIdleConnsPerHost: 1}}
	g.health = o.Backend.JoinPath("/health").String() + "?serializable=true"
	return g, nil
}

// newSession builds the server of one listening period.
func (g *Gate) newSession() *session {
	s := &session{listenersClosed: make(chan struct{}), streams: map[*stream]struct{}{}}
	var served http.Protocols
	served.SetHTTP1(true)
	if g.o.ServerTLS != nil {
		served.SetHTTP2(true)
	} else {
		served.SetUnencryptedHTTP2(true)
	}
	s.srv = &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.serve(s, w, r) }),
		Protocols: &served,
		// As many concurrent streams per connection as etcd allows (its
		// --max-concurrent-streams has no limit by default): a client that
		// opens its watches on one connection, as kube-apiserver does,
		// would otherwise find them queued behind the gate's default.
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: math.MaxInt32},
		TLSConfig:         g.o.ServerTLS,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          log.New(logWriter{g.o.Log}, "", 0),
		ConnState:         func(_ net.Conn, state http.ConnState) { g.countConn(s, state) },
	}
	s.srv.RegisterOnShutdown(func() { s.closeListeners.Do(func() { close(s.listenersClosed) }) })
	return s
}

// countConn keeps s.conns: a connection counts from its accept until it is
// closed (or hijacked, which HTTP/2 and gRPC never do).
func (g *Gate) countConn(s *session, state http.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch state {
	case http.StateNew:
		s.conns++
	case http.StateClosed, http.StateHijacked:
		s.conns--
	default:
		return
	}
	g.notifyLocked()
}

// Serve runs the gate until Close, with l (the member's advertised client
// port) as its first listener: it serves while its member answers and no
// drain is in force, and listens on l's address again when it may serve
// again. It closes l when it does not serve at once. It returns nil after
// Close, also when Close came first.
func (g *Gate) Serve(l net.Listener) error { return g.run(l.Addr().String(), l) }

// ListenAndServe is Serve on addr, listened on once the member serves.
// Before that a client's connection is refused, as by a member that is
// not up: a gate that accepted it would only have errors to give.
func (g *Gate) ListenAndServe(addr string) error { return g.run(addr, nil) }

// run is the gate's supervisor: it probes the member, and listens while
// the member serves and no drain is in force.
//
// Why the gate stops listening when its member is gone: kube-apiserver's
// etcd client balances over its endpoints and moves away from one whose
// connection is refused, but a gate that accepts the connection and fails
// every call keeps it there, each write failed (a write is retried only
// when provably never sent).
func (g *Gate) run(addr string, first net.Listener) error {
	g.mu.Lock()
	if g.addr != "" {
		g.mu.Unlock()
		if first != nil {
			_ = first.Close()
		}
		return errors.New("clientgate: the gate runs already")
	}
	g.addr = addr
	g.mu.Unlock()
	defer g.probe.CloseIdleConnections()
	tick := time.NewTicker(g.o.ProbeInterval)
	defer tick.Stop()
	for {
		g.mu.Lock()
		closed, drained, serving := g.closed, g.drained, g.sess != nil
		g.mu.Unlock()
		if closed {
			if first != nil {
				_ = first.Close()
			}
			return nil
		}
		if !drained {
			up, sure := g.probeMember()
			switch {
			case up && !serving:
				l := first
				first = nil
				if l == nil {
					var err error
					if l, err = net.Listen("tcp", addr); err != nil {
						g.o.Log.Error(err, "listening; trying again", "address", addr)
						break
					}
				}
				g.open(l)
			case !up && sure && serving:
				g.memberGone("it does not answer its probe")
			case !up && sure:
				g.mu.Lock()
				g.memberDown = true
				g.mu.Unlock()
			}
		}
		// A listener not served keeps clients waiting in its backlog.
		if first != nil && (drained || !serving) {
			g.mu.Lock()
			idle := g.sess == nil
			g.mu.Unlock()
			if idle {
				_ = first.Close()
				first = nil
			}
		}
		select {
		case <-g.wake:
		case <-tick.C:
		}
	}
}

// probeMember asks the member whether it serves: any HTTP answer says it
// does (a learner's, one without a leader); an error that is not a timeout
// says it does not (sure is then true).
func (g *Gate) probeMember() (up, sure bool) {
	resp, err := g.probe.Get(g.health)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return true, true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false, false
	}
	return false, true
}

// kick makes the supervisor look at the state now.
func (g *Gate) kick() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// open serves a new session on l, unless a drain or Close came meanwhile.
func (g *Gate) open(l net.Listener) {
	s := g.newSession()
	g.mu.Lock()
	if g.drained || g.closed || g.sess != nil {
		g.mu.Unlock()
		_ = l.Close()
		return
	}
	wasDown := g.memberDown
	g.sess, g.memberDown = s, false
	g.live[s] = struct{}{}
	g.notifyLocked()
	g.mu.Unlock()
	g.o.Log.Info("client gate serving", "address", l.Addr().String(), "backend", g.o.Backend.String(), "tls", g.o.ServerTLS != nil, "memberBack", wasDown)
	go func() {
		var err error
		if g.o.ServerTLS != nil {
			err = s.srv.ServeTLS(l, "", "")
		} else {
			err = s.srv.Serve(l)
		}
		g.mu.Lock()
		delete(g.live, s)
		ended := g.sess == s
		if ended {
			g.sess = nil
		}
		g.notifyLocked()
		g.mu.Unlock()
		if ended && !errors.Is(err, http.ErrServerClosed) {
			// The listener failed: the supervisor listens anew.
			g.o.Log.Error(err, "client gate listener")
			_ = s.srv.Close()
			g.kick()
		}
	}()
}

// memberGone stops listening because the member does not serve, and sends
// the gate's clients away (GOAWAY), as a drain does; the supervisor listens
// again once the member answers its probe.
func (g *Gate) memberGone(why string) {
	g.mu.Lock()
	s := g.sess
	g.sess, g.memberDown = nil, true
	g.notifyLocked()
	g.mu.Unlock()
	if s == nil {
		return
	}
	g.o.Log.Info("the member does not serve: the gate stops listening and sends its clients to other members", "reason", why)
	g.kick()
	// The calls in flight at a member that is gone are not waited for:
	// they end with their connection to it.
	go func() { _ = g.stop(context.Background(), s, false) }()
}

// Close ends every connection at once; Serve returns.
func (g *Gate) Close() error {
	g.mu.Lock()
	g.closed = true
	g.sess = nil
	live := make([]*session, 0, len(g.live))
	for s := range g.live {
		live = append(live, s)
	}
	g.notifyLocked()
	g.mu.Unlock()
	g.kick()
	var errs []error
	for _, s := range live {
		errs = append(errs, g.closeSession(s))
	}
	return errors.Join(errs...)
}

// closeSession ends a session's streams and connections at once.
func (g *Gate) closeSession(s *session) error {
	g.endStreams(s)
	return s.srv.Close()
}

// Ready tells whether the gate takes clients as far as the membership
// controller is concerned: false from Drain to Undrain. (Whether the
// member serves is the member's readiness.)
func (g *Gate) Ready() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.drained && !g.closed
}

// Serving tells whether the gate listens now: not drained, and its member
// answered the last probe.
func (g *Gate) Serving() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sess != nil
}

// Held tells whether a hold makes new calls wait now.
func (g *Gate) Held() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return time.Now().Before(g.heldTill)
}

// InFlight is the number of unary calls forwarded and not yet answered.
func (g *Gate) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight
}

// StopDrainTimeout bounds the drain of a gate whose pod ends (the
// sidecar's SIGTERM): within the pod's termination grace period. The
// webhook delays etcd's own stop by a preStop hook at least this long, so
// that the calls still in flight through the gate end before etcd does.
const StopDrainTimeout = 5 * time.Second

// closeGrace bounds how long a drain waits, after its last call ended, for
// the clients to close their connections (they got GOAWAY) before the gate
// closes them: a connection left then carries no call.
const closeGrace = time.Second

// Drain moves the gate's clients away (see the package comment) and
// returns once no call is left, or with ctx's error after ending whatever
// was left. The gate serves nobody until Undrain.
func (g *Gate) Drain(ctx context.Context) error {
	g.mu.Lock()
	g.drained = true
	s := g.sess
	g.sess = nil
	g.notifyLocked()
	g.mu.Unlock()
	if s == nil {
		// Not listening (drained already, or its member is gone): the
		// calls still in flight are waited for all the same.
		return g.waitIdle(ctx, false)
	}
	return g.stop(ctx, s, true)
}

// Undrain ends a drain: the gate listens again once its member answers
// its probe. It does nothing to a gate that is not drained.
func (g *Gate) Undrain() {
	g.mu.Lock()
	was := g.drained
	g.drained = false
	g.notifyLocked()
	g.mu.Unlock()
	if was {
		g.o.Log.Info("drain undone: the gate takes clients again once its member serves")
		g.kick()
	}
}

// stop sends the clients of session s away: its listener closes, every
// connection gets GOAWAY (a gRPC client then opens its next calls on
// another address and keeps the calls it has in flight), the unary calls
// in flight are waited for when waitCalls, then the streams end. It
// returns with ctx's error after closing whatever was left.
func (g *Gate) stop(ctx context.Context, s *session, waitCalls bool) error {
	// Shutdown closes the listener and sends GOAWAY on every connection;
	// the clients close their connections once their calls are done,
	// which the streams prevent until endStreams below. Shutdown itself
	// returns at its next poll after that; the drain does not wait for
	// it (connsClosed).
	go func() { _ = s.srv.Shutdown(context.WithoutCancel(ctx)) }()
	select {
	case <-s.listenersClosed:
	case <-ctx.Done():
		return errors.Join(fmt.Errorf("clientgate: the listener is not closed yet: %w", ctx.Err()), g.closeSession(s))
	}
	if waitCalls {
		if err := g.waitIdle(ctx, false); err != nil {
			return errors.Join(err, g.closeSession(s))
		}
	}
	n := g.endStreams(s)
	g.o.Log.Info("clients sent away: unary calls finished, streams ended", "streams", n)
	graceCtx, cancel := context.WithTimeout(ctx, closeGrace)
	defer cancel()
	if g.connsClosed(graceCtx, s) != nil {
		// A client that keeps a connection it was told to leave, with no
		// call on it (or the caller's deadline): closing it loses nothing.
		_ = s.srv.Close()
	}
	if !waitCalls {
		return nil
	}
	// A call that raced the GOAWAY finishes before the drain is done.
	return g.waitIdle(ctx, false)
}

// connsClosed waits until no client connection of s is open.
func (g *Gate) connsClosed(ctx context.Context, s *session) error {
	return g.waitZero(ctx, "connection(s) still open", func() int { return s.conns })
}

// Hold makes new reads and proposals (see callKind) wait for at most max,
// and returns once the proposals already forwarded have been answered (or
// with ctx's error, the hold still in force until its end). Release ends
// the hold early.
func (g *Gate) Hold(ctx context.Context, max time.Duration) (release func(), err error) {
	g.mu.Lock()
	g.hold++
	id := g.hold
	g.heldTill = time.Now().Add(max)
	g.notifyLocked()
	g.mu.Unlock()
	// The hold ends by itself: a waiting call re-checks when notified.
	timer := time.AfterFunc(max, func() {
		g.mu.Lock()
		g.notifyLocked()
		g.mu.Unlock()
	})
	release = func() {
		timer.Stop()
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.hold == id {
			g.heldTill = time.Time{}
			g.notifyLocked()
		}
	}
	g.o.Log.V(1).Info("holding new calls", "max", max)
	return release, g.waitIdle(ctx, true)
}

// waitIdle waits until no unary call is in flight, or, with
// proposalsOnly, no proposal.
func (g *Gate) waitIdle(ctx context.Context, proposalsOnly bool) error {
	return g.waitZero(ctx, "call(s) still in flight", func() int {
		if proposalsOnly {
			return g.proposals
		}
		return g.inFlight
	})
}

// waitZero waits until count, read under g.mu, is zero; what names the
// count in the error that ctx's end returns.
func (g *Gate) waitZero(ctx context.Context, what string, count func() int) error {
	for {
		g.mu.Lock()
		n, changed := count(), g.changed
		g.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("clientgate: %d %s: %w", n, what, ctx.Err())
		}
	}
}

// endStreams cancels every streaming call of s and says how many there
// were.
func (g *Gate) endStreams(s *session) int {
	g.mu.Lock()
	streams := s.streams
	s.streams = map[*stream]struct{}{}
	s.streamsEnded = true
	g.mu.Unlock()
	for st := range streams {
		st.cancel()
	}
	return len(streams)
}

// notifyLocked wakes everyone waiting for a change. g.mu must be held.
func (g *Gate) notifyLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// errNotForwarded is a call the gate answered without sending it on.
var errNotForwarded = errors.New("the member is being drained")

// serve forwards one call of session s, counting unary calls in flight and
// making new ones wait while a hold is in force.
func (g *Gate) serve(s *session, w http.ResponseWriter, r *http.Request) {
	if isGRPC(r) && streamingMethods[r.URL.Path] {
		ctx, cancel := context.WithCancel(r.Context())
		// Cancelling the forwarded call alone does not end it: the
		// HTTP/2 transport goes on reading the client's side of the
		// stream, which a watch keeps open without sending, and abandons
		// the response only once that read ends. Closing the body ends
		// the read, so the client gets its stream reset at once, and a
		// draining connection keeps nothing open (a drain of a member
		// with watches took the whole closeGrace without it:
		// BenchmarkDrain).
		st := &stream{cancel: func() { cancel(); _ = r.Body.Close() }}
		g.mu.Lock()
		if s.streamsEnded {
			g.mu.Unlock()
			cancel()
			g.proxyError(w, r, errNotForwarded)
			return
		}
		s.streams[st] = struct{}{}
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			delete(s.streams, st)
			g.mu.Unlock()
			cancel()
		}()
		g.proxy.ServeHTTP(w, r.WithContext(ctx))
		return
	}
	kind := kindOf(r)
	if err := g.enter(r.Context(), kind); err != nil {
		g.proxyError(w, r, err)
		return
	}
	defer g.leave(kind)
	if isGRPC(r) {
		resendable(r)
		// A unary answer is one message and its trailers, of no use to
		// the client before the trailers: flushing its headers and its
		// message as they come (the proxy flushes a gRPC answer after
		// every write, and its headers at once on a timer) costs a TLS
		// record, a write to the socket and a goroutine each, for nothing.
		w = unflushed{w}
	}
	g.proxy.ServeHTTP(w, r)
}

// unflushed hides a ResponseWriter's Flush: what is written goes out when
// the handler returns, or when the server's buffer fills.
type unflushed struct{ w http.ResponseWriter }

func (u unflushed) Header() http.Header         { return u.w.Header() }
func (u unflushed) Write(p []byte) (int, error) { return u.w.Write(p) }
func (u unflushed) WriteHeader(code int)        { u.w.WriteHeader(code) }

// copyBuffers lends the proxy its copy buffers: without a pool it
// allocates and clears one of 32 KiB for every call.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte  { return *copyBufferPool.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { copyBufferPool.Put(&b) }

// maxResendable bounds the unary requests the gate keeps to send again:
// etcd's client sends at most 2 MiB (its MaxCallSendMsgSize), etcd takes
// at most 1.5 MiB by default.
const maxResendable = 4 << 20

// resendable reads a unary call's request (one message, sent at once)
// whole, so that it can be sent again (GetBody). Go's HTTP/2 transport
// does that by itself when the member's connection ends before the member
// took the call (GOAWAY, as a member that stops sends); without GetBody it
// fails such a call once it began to read its body, and etcd's client
// would not retry the write. A larger request is sent as it comes.
func resendable(r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	buf, err := io.ReadAll(io.LimitReader(r.Body, maxResendable+1))
	if err != nil || len(buf) > maxResendable {
		r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), errReader{err}, r.Body), r.Body}
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(buf))
	// A known length lets the transport end the stream with the message's
	// DATA frame, not with an empty one after it: a frame, a TLS record
	// and a write to the socket less for every call.
	r.ContentLength = int64(len(buf))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	io.Closer
}

// errReader returns err, or EOF for none.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	return 0, io.EOF
}

// enter counts the call in flight; a read or a proposal first waits while
// a hold is in force.
func (g *Gate) enter(ctx context.Context, kind callKind) error {
	for {
		g.mu.Lock()
		if kind == passCall || time.Until(g.heldTill) <= 0 {
			g.inFlight++
			if kind == proposalCall {
				g.proposals++
			}
			g.mu.Unlock()
			return nil
		}
		changed := g.changed
		g.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (g *Gate) leave(kind callKind) {
	g.mu.Lock()
	g.inFlight--
	if kind == proposalCall {
		g.proposals--
	}
	g.notifyLocked()
	g.mu.Unlock()
}

// notSentStatus is the gRPC status message of a call the gate did not
// send to its member. etcd's client retries a write on another endpoint
// only when its Unavailable error has this description (or "there is no
// address available"; client/v3 retry.go, isSafeRetryMutableRPC): the one
// gRPC gave for a call that found no connection, which is what the gate
// has. Any other message fails the write at kube-apiserver.
const notSentStatus = "there is no connection available"

// notSent tells an error that proves the call never reached the member:
// the gate did not forward it, or the connection to the member could not
// be made.
func notSent(err error) bool {
	var op *net.OpError
	return errors.Is(err, errNotForwarded) || (errors.As(err, &op) && op.Op == "dial")
}

// proxyError answers a call the gate could not forward: as gRPC status
// Unavailable for gRPC (the code etcd's own clients treat as "try another
// member" for reads; for writes only with notSentStatus, given when the
// call provably did not reach the member), as 502 otherwise. A member
// that refused the connection is gone: the gate stops listening.
func (g *Gate) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	unsent := notSent(err)
	g.o.Log.Info("could not forward a call", "method", r.URL.Path, "sent", !unsent, "error", err.Error())
	if errors.Is(err, syscall.ECONNREFUSED) {
		g.memberGone("it refused a connection: " + err.Error())
	}
	if isGRPC(r) {
		msg := "druid-stretch client gate: " + err.Error()
		if unsent {
			msg = notSentStatus
		}
		// gRPC reads the status from the trailers: HTTP/2 sends the
		// response headers without END_STREAM, so a status there would
		// read as "closed the stream without sending trailers".
		w.Header().Set("Content-Type", "application/grpc")
		w.WriteHeader(http.StatusOK)
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "14")
		w.Header().Set(http.TrailerPrefix+"Grpc-Message", url.PathEscape(msg))
		return
	}
	http.Error(w, "druid-stretch client gate: "+err.Error(), http.StatusBadGateway)
}

// grpcStatusKeys are the fields of a gRPC status.
var grpcStatusKeys = []string{"Grpc-Status", "Grpc-Message", "Grpc-Status-Details-Bin"}

// statusToTrailers moves the status of a trailers-only gRPC answer (an
// error without a message, such as etcd's "rpc not supported for
// learner": one HEADERS frame that ends the stream, the status in it) into
// trailers. The proxy flushes the headers on its own timer while it copies
// the empty body: when the timer won, the status went out in headers that
// did not end the stream, and gRPC clients read the answer as "server
// closed the stream without sending trailers" (codes.Internal), which
// etcd's client does not retry. Sent as trailers, the status arrives
// whichever comes first.
func statusToTrailers(res *http.Response) error {
	if !strings.HasPrefix(res.Header.Get("Content-Type"), "application/grpc") || res.Header.Get("Grpc-Status") == "" {
		return nil
	}
	if res.Trailer == nil {
		res.Trailer = http.Header{}
	}
	for _, k := range grpcStatusKeys {
		if v, ok := res.Header[k]; ok {
			res.Trailer[k] = v
			delete(res.Header, k)
		}
	}
	return nil
}

// isGRPC tells a gRPC call from plain HTTP.
func isGRPC(r *http.Request) bool {
	return r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc")
}

// logWriter turns net/http's log lines into logr messages.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
