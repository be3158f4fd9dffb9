// Package workload is the client traffic that proves a membership change
// safe: goroutines that update and read a few keys the way kube-apiserver
// does (optimistic-concurrency transactions, short attempt timeouts, retries
// of transient errors), a record of every request, and the checks run on it
// afterwards: lost acknowledged writes, linearizability (porcupine), and the
// figures of the report (failed requests, write gaps, latency per phase).
package workload

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Workload runs the client traffic against one etcd cluster and records it.
type Workload struct {
	opts   Options
	log    logr.Logger
	client *clientv3.Client
	keys   []string
	start  time.Time // its monotonic reading is the history's clock
	// tag makes values unique across runs that share a prefix: the model
	// tells writes apart by value.
	tag string

	history *History

	mu       sync.Mutex
	phase    string
	preload  PreloadFigures
	started  bool
	stopping chan struct{}
	done     sync.WaitGroup
	stopOnce sync.Once

	live liveCounters
}

type liveCounters struct {
	writes, conflicts, reads, failed, retries atomic.Int64
	lastWriteLatency                          atomic.Int64 // ns
	lastAck                                   atomic.Int64 // ns on the workload clock
}

// New connects a client to opts.Endpoints. It does not send traffic yet.
func New(opts Options) (*Workload, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	var dial []grpc.DialOption
	if o.DialContext != nil {
		dial = append(dial, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return o.DialContext(ctx, "tcp", addr)
		}))
	}
	client, err := clientv3.New(clientv3.Config{
		DialOptions: dial,
		Endpoints:   o.Endpoints,
		TLS:         o.TLS,
		DialTimeout: o.AttemptTimeout,
		// kube-apiserver keeps its connections probed so that a dead member
		// is noticed without waiting for TCP.
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: o.AttemptTimeout,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("creating etcd client for %v: %w", o.Endpoints, err)
	}
	start := time.Now()
	keys := make([]string, o.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%skey-%03d", o.Prefix, i)
	}
	return &Workload{
		opts: o, log: o.Log, client: client, keys: keys, history: NewHistory(nil),
		start: start, tag: strconv.FormatInt(start.UnixNano()%(36*36*36*36), 36),
		phase: o.InitialPhase, stopping: make(chan struct{}),
	}, nil
}

// Client is the workload's etcd client, for callers that need to look at the
// same cluster through the same endpoints.
func (w *Workload) Client() *clientv3.Client { return w.client }

// Keys are the keys the workload updates and reads.
func (w *Workload) Keys() []string { return append([]string(nil), w.keys...) }

// SetEndpoints routes all further requests to eps, for example when members
// join (once their readiness passes) or are about to be removed (drop a
// member before its removal is sent: etcd 3.6 must not serve a request while
// applying its own removal). Requests already in flight on a dropped
// endpoint finish there.
func (w *Workload) SetEndpoints(eps ...string) error {
	if len(eps) == 0 {
		return errors.New("workload: refusing to route client traffic to no endpoint")
	}
	for _, ep := range eps {
		if strings.TrimSpace(ep) == "" {
			return fmt.Errorf("workload: empty endpoint in %q", eps)
		}
	}
	w.client.SetEndpoints(eps...)
	w.log.V(1).Info("client endpoints changed", "endpoints", eps)
	return nil
}

// Endpoints are the client URLs in use.
func (w *Workload) Endpoints() []string { return w.client.Endpoints() }

// now is the workload clock: monotonic, zero at New.
func (w *Workload) now() time.Duration { return time.Since(w.start) }

// MarkPhase starts a named phase (e.g. "during", "after"): operations called
// from now on are counted in it, and the plot marks its start.
func (w *Workload) MarkPhase(name string) {
	w.mu.Lock()
	w.phase = name
	w.mu.Unlock()
	w.history.AddMark(Mark{At: w.now(), Name: name, Phase: true})
}

// Mark records a named event, such as a migration step, for the plot and
// the report.
func (w *Workload) Mark(event string) { w.MarkAt(event, time.Now()) }

// MarkAt records an event that happened at t (a step timed elsewhere, e.g.
// from a status condition's transition time).
func (w *Workload) MarkAt(event string, t time.Time) {
	w.history.AddMark(Mark{At: w.Since(t), Name: event})
}

// Since converts a wall-clock instant into the workload clock, for callers
// that timed a step themselves.
func (w *Workload) Since(t time.Time) time.Duration { return t.Sub(w.start) }

// StartedAt is the wall-clock instant the workload clock counts from.
func (w *Workload) StartedAt() time.Time { return w.start }

func (w *Workload) currentPhase() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.phase
}

// History is the record of the run.
func (w *Workload) History() *History { return w.history }

// Start reads the keys' current state (the history's initial state) and
// starts the writers and readers. They run until Stop or until ctx ends.
func (w *Workload) Start(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return errors.New("workload already started")
	}
	w.started = true
	w.mu.Unlock()

	initial, err := w.readAll(ctx)
	if err != nil {
		return fmt.Errorf("reading the workload keys' initial state: %w", err)
	}
	w.history.setInitial(initial)
	w.history.AddMark(Mark{At: w.now(), Name: w.opts.InitialPhase, Phase: true})

	cache := newKeyCache(initial)
	for i := 0; i < w.opts.Writers; i++ {
		w.done.Add(1)
		go w.runWriter(i, cache)
	}
	for i := 0; i < w.opts.Readers; i++ {
		w.done.Add(1)
		go w.runReader(w.opts.Writers + i)
	}
	go func() {
		select {
		case <-ctx.Done():
			w.signalStop()
		case <-w.stopping:
		}
	}()
	return nil
}

// Stop lets every request in flight finish (each within its deadline), then
// returns. The client stays open for the checks; Close releases it.
func (w *Workload) Stop() {
	w.signalStop()
	w.done.Wait()
}

func (w *Workload) signalStop() { w.stopOnce.Do(func() { close(w.stopping) }) }

// Close stops the traffic and closes the client.
func (w *Workload) Close() error {
	w.Stop()
	return w.client.Close()
}

// pause waits d, or returns false when the workload is stopping.
func (w *Workload) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.stopping:
		return false
	case <-t.C:
		return true
	}
}

func (w *Workload) stopped() bool {
	select {
	case <-w.stopping:
		return true
	default:
		return false
	}
}

// runWriter updates random keys. The writers share a cache of the keys'
// state, as kube-apiserver's writers share its watch cache: a stale entry
// costs a conflict, and the conflict's answer refreshes it.
func (w *Workload) runWriter(client int, cache *keyCache) {
	defer w.done.Done()
	rng := rand.New(rand.NewPCG(uint64(client), uint64(w.start.UnixNano())))
	for seq := 0; !w.stopped(); seq++ {
		key := w.keys[rng.IntN(len(w.keys))]
		op := w.write(client, key, cache.get(key), w.value(client, seq))
		switch op.Outcome {
		case Succeeded:
			cache.observe(key, KeyValue{Value: op.Value, Rev: op.Rev})
		case Conflict:
			cache.observe(key, KeyValue{Value: op.SeenValue, Rev: op.Rev})
		}
		if !w.pause(w.opts.WriteInterval) {
			return
		}
	}
}

// keyCache is the writers' shared belief of each key's current state.
type keyCache struct {
	mu sync.Mutex
	kv map[string]KeyValue
}

func newKeyCache(initial map[string]KeyValue) *keyCache {
	c := &keyCache{kv: make(map[string]KeyValue, len(initial))}
	for k, v := range initial {
		c.kv[k] = v
	}
	return c
}

func (c *keyCache) get(key string) KeyValue {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kv[key]
}

// observe keeps the newest state seen; answers arrive out of order.
func (c *keyCache) observe(key string, kv KeyValue) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if kv.Rev > c.kv[key].Rev {
		c.kv[key] = kv
	}
}

func (w *Workload) runReader(client int) {
	defer w.done.Done()
	rng := rand.New(rand.NewPCG(uint64(client), uint64(w.start.UnixNano())))
	for !w.stopped() {
		w.read(client, w.keys[rng.IntN(len(w.keys))])
		if !w.pause(w.opts.ReadInterval) {
			return
		}
	}
}

// value makes a value unique to (client, seq), padded to ValueSize; the
// model relies on values being unique.
func (w *Workload) value(client, seq int) string {
	id := fmt.Sprintf("w%d-%d-%s.", client, seq, w.tag)
	if len(id) >= w.opts.ValueSize {
		return id
	}
	return id + strings.Repeat(".", w.opts.ValueSize-len(id))
}

// write is one GuaranteedUpdate transaction with its retries, recorded.
func (w *Workload) write(client int, key string, expected KeyValue, value string) Op {
	op := Op{
		Client: client, Kind: Write, Key: key,
		ExpectedValue: expected.Value, ExpectedRev: expected.Rev, Value: value,
		Call: w.now(), Phase: w.currentPhase(),
	}
	r := newRetrier(w.opts)
	for {
		var resp *clientv3.TxnResponse
		err, again := r.attempt(func(ctx context.Context) error {
			var err error
			resp, err = w.client.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(key), "=", expected.Rev)).
				Then(clientv3.OpPut(key, value)).
				Else(clientv3.OpGet(key)).
				Commit()
			return err
		})
		if err == nil {
			op.HeaderRev = resp.Header.Revision
			if resp.Succeeded {
				op.Outcome, op.Rev = Succeeded, resp.Header.Revision
				break
			}
			seen := firstKeyValue(resp.Responses[0].GetResponseRange().Kvs)
			op.SeenValue, op.Rev = seen.Value, seen.Rev
			op.Outcome = Conflict
			if r.attempts > 1 {
				w.resolveRetriedWrite(&op, r)
			}
			break
		}
		if !again {
			op.Outcome, op.Err = Failed, clientErr(err)
			break
		}
		op.Err = clientErr(err)
		w.log.V(1).Info("retrying write", "key", key, "attempt", r.attempts, "error", op.Err)
	}
	op.Attempts = r.attempts
	op.Return = w.now()
	w.account(op)
	w.History().Record(op)
	return op
}

// resolveRetriedWrite settles a retried write whose compare failed: an
// earlier attempt that timed out may have been applied. A CAS on
// ExpectedRev can only be the first change of the key after ExpectedRev, so
// that change says whether ours was applied. When it cannot be read, the
// write stays ambiguous (Failed) rather than guessed.
func (w *Workload) resolveRetriedWrite(op *Op, r *retrier) {
	if op.SeenValue == op.Value {
		op.Outcome = Succeeded
		return
	}
	next, err := w.firstChangeAfter(op.Key, op.ExpectedRev, r)
	switch {
	case err != nil:
		op.Outcome, op.Err = Failed, fmt.Sprintf("cannot tell whether a timed-out attempt was applied: %v", err)
		op.SeenValue, op.Rev = "", 0
	case next.Value == op.Value:
		op.Outcome, op.Rev, op.SeenValue = Succeeded, next.Rev, ""
	}
}

// firstChangeAfter is the key's first value written after rev, read with a
// watch from rev+1 (the run never compacts, so the history is there).
func (w *Workload) firstChangeAfter(key string, rev int64, r *retrier) (KeyValue, error) {
	var found KeyValue
	for {
		err, again := r.attempt(func(ctx context.Context) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			for resp := range w.client.Watch(ctx, key, clientv3.WithRev(rev+1)) {
				if err := resp.Err(); err != nil {
					return err
				}
				for _, ev := range resp.Events {
					if ev.Type == clientv3.EventTypePut {
						found = KeyValue{Value: string(ev.Kv.Value), Rev: ev.Kv.ModRevision}
					} else {
						found = KeyValue{Rev: ev.Kv.ModRevision}
					}
					return nil
				}
			}
			return ctx.Err()
		})
		if err == nil {
			return found, nil
		}
		if !again {
			return KeyValue{}, err
		}
	}
}

// read is one linearizable Get with its retries, recorded.
func (w *Workload) read(client int, key string) Op {
	op := Op{Client: client, Kind: Read, Key: key, Call: w.now(), Phase: w.currentPhase()}
	r := newRetrier(w.opts)
	for {
		var resp *clientv3.GetResponse
		err, again := r.attempt(func(ctx context.Context) error {
			var err error
			resp, err = w.client.Get(ctx, key)
			return err
		})
		if err == nil {
			kv := firstKeyValue(resp.Kvs)
			op.Outcome, op.SeenValue, op.Rev, op.HeaderRev = Succeeded, kv.Value, kv.Rev, resp.Header.Revision
			break
		}
		if !again {
			op.Outcome, op.Err = Failed, clientErr(err)
			break
		}
		op.Err = clientErr(err)
		w.log.V(1).Info("retrying read", "key", key, "attempt", r.attempts, "error", op.Err)
	}
	op.Attempts = r.attempts
	op.Return = w.now()
	w.account(op)
	w.History().Record(op)
	return op
}

func (w *Workload) account(op Op) {
	w.live.retries.Add(int64(op.Attempts - 1))
	switch {
	case op.Outcome == Failed:
		w.live.failed.Add(1)
		w.log.Info("request failed after retries", "op", op.Kind.String(), "key", op.Key, "attempts", op.Attempts, "error", op.Err)
	case op.Kind == Read:
		w.live.reads.Add(1)
	case op.Outcome == Conflict:
		w.live.conflicts.Add(1)
		w.live.lastWriteLatency.Store(int64(op.Latency()))
	default:
		w.live.writes.Add(1)
		w.live.lastWriteLatency.Store(int64(op.Latency()))
		w.live.lastAck.Store(int64(op.Return))
	}
}

func firstKeyValue(kvs []*mvccpb.KeyValue) KeyValue {
	if len(kvs) == 0 {
		return KeyValue{}
	}
	return KeyValue{Value: string(kvs[0].Value), Rev: kvs[0].ModRevision}
}

// readAll reads the workload keys in one range request.
func (w *Workload) readAll(ctx context.Context) (map[string]KeyValue, error) {
	var resp *clientv3.GetResponse
	err := retry(ctx, w.opts, func(actx context.Context) error {
		var err error
		resp, err = w.client.Get(actx, w.opts.Prefix+"key-", clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]KeyValue, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = KeyValue{Value: string(kv.Value), Rev: kv.ModRevision}
	}
	return out, nil
}

// LiveStats is a snapshot of the traffic for progress output.
type LiveStats struct {
	Elapsed                    time.Duration
	Writes, Conflicts, Reads   int64
	Failed, Retries            int64
	LastWriteLatency           time.Duration
	SinceLastAcknowledgedWrite time.Duration
}

// Live returns the traffic counters so far.
func (w *Workload) Live() LiveStats {
	now := w.now()
	s := LiveStats{
		Elapsed: now, Writes: w.live.writes.Load(), Conflicts: w.live.conflicts.Load(),
		Reads: w.live.reads.Load(), Failed: w.live.failed.Load(), Retries: w.live.retries.Load(),
		LastWriteLatency: time.Duration(w.live.lastWriteLatency.Load()),
	}
	if last := w.live.lastAck.Load(); last > 0 {
		s.SinceLastAcknowledgedWrite = now - time.Duration(last)
	}
	return s
}
