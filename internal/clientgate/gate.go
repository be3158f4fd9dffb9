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
//     stop applies only to plain listeners.
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
package clientgate

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
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
	// Log receives drains, holds and proxy errors.
	Log logr.Logger
}

// Gate is a running gate. It is safe for concurrent use.
type Gate struct {
	o     Options
	srv   *http.Server
	proxy *httputil.ReverseProxy

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced on every state change
	inFlight  int           // unary calls forwarded and not yet answered
	proposals int           // of them, proposals (see callKind)
	heldTill  time.Time     // new reads and proposals wait until then, or Release
	hold      uint64        // the current hold, so a stale Release is a no-op
	draining  bool
	// streamsEnded refuses new streaming calls: a stream opened after the
	// drain ended the others would keep the drain waiting.
	streamsEnded bool
	streams      map[*stream]struct{}
	// conns counts the client connections open (http.Server's ConnState):
	// a drain ends when they are gone, not at Shutdown's next poll of
	// them, which backs off to 500 ms while the clients leave.
	conns int
	// listenersClosed is closed once Shutdown has closed the listener
	// (http.Server.RegisterOnShutdown): from then on no new client comes.
	listenersClosed chan struct{}
	closeListeners  sync.Once
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

// New builds a gate; Serve runs it on a listener.
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
	g := &Gate{o: o, changed: make(chan struct{}), streams: map[*stream]struct{}{}, listenersClosed: make(chan struct{})}

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
		// gRPC answers stream: every frame goes out as it comes.
		FlushInterval:  -1,
		ModifyResponse: statusToTrailers,
		ErrorHandler:   g.proxyError,
		// A stream the gate ended at a drain shows here as a cancelled
		// copy: expected, so at V(1).
		ErrorLog: log.New(logWriter{o.Log.V(1)}, "", 0),
	}

	var served http.Protocols
	served.SetHTTP1(true)
	if o.ServerTLS != nil {
		served.SetHTTP2(true)
	} else {
		served.SetUnencryptedHTTP2(true)
	}
	g.srv = &http.Server{
		Handler:           g,
		Protocols:         &served,
		TLSConfig:         o.ServerTLS,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          log.New(logWriter{o.Log}, "", 0),
		ConnState:         g.countConn,
	}
	g.srv.RegisterOnShutdown(func() { g.closeListeners.Do(func() { close(g.listenersClosed) }) })
	return g, nil
}

// countConn keeps conns: a connection counts from its accept until it is
// closed (or hijacked, which HTTP/2 and gRPC never do).
func (g *Gate) countConn(_ net.Conn, state http.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch state {
	case http.StateNew:
		g.conns++
	case http.StateClosed, http.StateHijacked:
		g.conns--
	default:
		return
	}
	g.notifyLocked()
}

// Serve serves the clients that l accepts (the member's advertised client
// port) until Drain or Close, and closes l; it returns nil after either,
// also when either came first.
func (g *Gate) Serve(l net.Listener) error {
	var err error
	if g.o.ServerTLS != nil {
		err = g.srv.ServeTLS(l, "", "")
	} else {
		err = g.srv.Serve(l)
	}
	if errors.Is(err, http.ErrServerClosed) {
		_ = l.Close()
		return nil
	}
	return err
}

// Close ends every connection at once.
func (g *Gate) Close() error {
	g.endStreams()
	return g.srv.Close()
}

// Ready tells whether the gate takes clients: false once a drain began.
func (g *Gate) Ready() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.draining
}

// InFlight is the number of unary calls forwarded and not yet answered.
func (g *Gate) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight
}

// closeGrace bounds how long a drain waits, after its last call ended, for
// the clients to close their connections (they got GOAWAY) before the gate
// closes them: a connection left then carries no call.
const closeGrace = time.Second

// Drain moves the gate's clients away (see the package comment) and
// returns once no call is left, or with ctx's error after ending whatever
// was left. The gate serves nobody afterwards.
func (g *Gate) Drain(ctx context.Context) error {
	g.mu.Lock()
	g.draining = true
	g.notifyLocked()
	g.mu.Unlock()

	// Shutdown closes the listener and sends GOAWAY on every connection;
	// the clients close their connections once their calls are done,
	// which the streams prevent until endStreams below. Shutdown itself
	// returns at its next poll after that; the drain does not wait for
	// it (connsClosed).
	go func() { _ = g.srv.Shutdown(context.WithoutCancel(ctx)) }()
	select {
	case <-g.listenersClosed:
	case <-ctx.Done():
		return errors.Join(fmt.Errorf("clientgate: the listener is not closed yet: %w", ctx.Err()), g.Close())
	}
	if err := g.waitIdle(ctx, false); err != nil {
		return errors.Join(err, g.Close())
	}
	n := g.endStreams()
	g.o.Log.Info("drained: unary calls finished, streams ended", "streams", n)
	graceCtx, cancel := context.WithTimeout(ctx, closeGrace)
	defer cancel()
	if g.connsClosed(graceCtx) != nil {
		// A client that keeps a connection it was told to leave, with no
		// call on it (or the caller's deadline): closing it loses nothing.
		_ = g.srv.Close()
	}
	// A call that raced the GOAWAY finishes before the drain is done.
	return g.waitIdle(ctx, false)
}

// connsClosed waits until no client connection is open.
func (g *Gate) connsClosed(ctx context.Context) error {
	return g.waitZero(ctx, "connection(s) still open", func() int { return g.conns })
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

// endStreams cancels every streaming call and says how many there were.
func (g *Gate) endStreams() int {
	g.mu.Lock()
	streams := g.streams
	g.streams = map[*stream]struct{}{}
	g.streamsEnded = true
	g.mu.Unlock()
	for s := range streams {
		s.cancel()
	}
	return len(streams)
}

// notifyLocked wakes everyone waiting for a change. g.mu must be held.
func (g *Gate) notifyLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// ServeHTTP forwards one call, counting unary calls in flight and making
// new ones wait while a hold is in force.
func (g *Gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
		s := &stream{cancel: func() { cancel(); _ = r.Body.Close() }}
		g.mu.Lock()
		if g.streamsEnded {
			g.mu.Unlock()
			cancel()
			g.proxyError(w, r, errors.New("the member is being drained"))
			return
		}
		g.streams[s] = struct{}{}
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			delete(g.streams, s)
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
	g.proxy.ServeHTTP(w, r)
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

// proxyError answers a call the gate could not forward: as gRPC status
// Unavailable for gRPC (the code etcd's own clients treat as "try another
// member" for reads), as 502 otherwise.
func (g *Gate) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	g.o.Log.Info("could not forward a call", "method", r.URL.Path, "error", err.Error())
	if isGRPC(r) {
		// gRPC reads the status from the trailers: HTTP/2 sends the
		// response headers without END_STREAM, so a status there would
		// read as "closed the stream without sending trailers".
		w.Header().Set("Content-Type", "application/grpc")
		w.WriteHeader(http.StatusOK)
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "14")
		w.Header().Set(http.TrailerPrefix+"Grpc-Message", url.PathEscape("druid-stretch client gate: "+err.Error()))
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
