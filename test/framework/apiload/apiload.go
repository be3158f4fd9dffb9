// Package apiload is the API-level workload of a live move: client-go
// clients updating and reading ConfigMaps through one or more real
// kube-apiservers whose storage is the etcd cluster being moved. A move is
// judged by what these clients see: every request with its HTTP status,
// error and failure class, per kube-apiserver; each server's /readyz over
// time; and, afterwards, whether the history is linearizable and whether
// any acknowledged write was lost.
//
// A ConfigMap's resourceVersion is its etcd ModRevision, so an Update that
// carries metadata.resourceVersion is the same compare-and-swap on the
// revision that internal/testing/workload records at the etcd level; requests are
// recorded as workload.Ops and checked with the same register model.
package apiload

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
)

// valueKey is the ConfigMap data key the load writes.
const valueKey = "value"

// Load runs the API traffic against the servers and records it.
type Load struct {
	opts    Options
	log     logr.Logger
	servers []*server
	// objects are every server's ConfigMaps; readers read all of them, so
	// a server's reads check what the other servers' writers wrote.
	objects []object
	start   time.Time // its monotonic reading is the load's clock
	// tag makes values unique across runs sharing a namespace: the model
	// tells writes apart by value.
	tag string

	mu       sync.Mutex
	phase    string
	marks    []Mark
	requests []Request
	history  *workload.History
	started  bool
	stopped  bool
	stopAt   time.Duration
	// trafficAt is when the writers started, after Start created the
	// objects through the first ready server: no write gap is counted
	// before it, since the load itself wrote nothing yet.
	trafficAt time.Duration

	stopping   chan struct{}
	stopOnce   sync.Once
	stopProbes context.CancelFunc
	done       sync.WaitGroup

	// route guards every server's routing fields (via, inflight, drained,
	// switchedTo, switchedAt). It is taken twice per request, so it is not
	// mu, which Results and Requests hold for longer; Switch takes it inside
	// mu.
	route sync.Mutex
}

// server is one kube-apiserver's clients and what was seen of its readiness.
type server struct {
	name    string
	index   int
	clients kubernetes.Interface
	// probe has its own client so that a slow probe neither waits for nor
	// delays the workload's requests in client-go's rate limiter.
	probe   rest.Interface
	objects []object
	cache   *objectCache

	ready     chan struct{} // closed at the first /readyz 200
	readyOnce sync.Once
	// switched is closed when Switch moves this server's clients away, so
	// that those still waiting for its readiness start (see awaitReady).
	switched chan struct{}

	// via is the server this server's clients send their requests through:
	// itself until a Switch moves them, as a DNS switch moves a shoot's
	// clients. It is never a server that was switched away itself.
	via *server
	// inflight counts the requests in flight through this server, of any
	// server's clients; drained, when set, is closed once it reaches 0 (a
	// Switch away from this server waits on it).
	inflight int
	drained  chan struct{}
	// switchedTo is where Switch moved this server's clients, at
	// switchedAt; nil while they still reach it.
	switchedTo *server
	switchedAt time.Duration

	mu         sync.Mutex
	firstReady time.Duration
	readyz     []ReadyzSample
}

// object is one ConfigMap of the load; key names it in the history.
type object struct {
	server int
	name   string
	key    string
}

// New makes the clients for opts.Servers. It sends nothing yet.
func New(opts Options) (*Load, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	l := &Load{
		opts: o, log: o.Log, start: start,
		tag:   strconv.FormatInt(start.UnixNano()%(36*36*36*36), 36),
		phase: o.InitialPhase, stopping: make(chan struct{}),
	}
	for i, s := range o.Servers {
		cfg := rest.CopyConfig(s.Config)
		cfg.Timeout, cfg.QPS, cfg.Burst = o.RequestTimeout, o.QPS, o.Burst
		cfg.UserAgent = "druid-stretch-apiload/" + s.Name
		clients, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("client for kube-apiserver %s: %w", s.Name, err)
		}
		probeCfg := rest.CopyConfig(cfg)
		probeCfg.Timeout = probeTimeout
		probe, err := discovery.NewDiscoveryClientForConfig(probeCfg)
		if err != nil {
			return nil, fmt.Errorf("readyz client for kube-apiserver %s: %w", s.Name, err)
		}
		srv := &server{
			name: s.Name, index: i, clients: clients, probe: probe.RESTClient(),
			cache: newObjectCache(), ready: make(chan struct{}), switched: make(chan struct{}),
		}
		srv.via = srv
		for j := range o.ObjectsPerServer {
			name := fmt.Sprintf("apiload-%s-%d", s.Name, j)
			obj := object{server: i, name: name, key: o.Namespace + "/" + name}
			srv.objects = append(srv.objects, obj)
			l.objects = append(l.objects, obj)
		}
		l.servers = append(l.servers, srv)
	}
	return l, nil
}

// now is the load's clock: monotonic, zero at New.
func (l *Load) now() time.Duration { return time.Since(l.start) }

// StartedAt is the wall-clock instant the load's clock counts from.
func (l *Load) StartedAt() time.Time { return l.start }

// MarkPhase starts a named phase (e.g. "during", "after"): requests called
// from now on are counted in it.
func (l *Load) MarkPhase(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.phase = name
	l.marks = append(l.marks, Mark{At: l.now(), Name: name, Phase: true})
}

// Mark records a named event, such as a migration step, for the report.
func (l *Load) Mark(event string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marks = append(l.marks, Mark{At: l.now(), Name: event})
}

func (l *Load) currentPhase() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.phase
}

// Requests returns a copy of every request recorded so far, in the order
// they returned, for plots and for callers that watch progress.
func (l *Load) Requests() []Request {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.requests)
}

// Start probes every server's /readyz, waits until at least one answers 200,
// creates the namespace and every server's ConfigMaps through it (all
// servers share one etcd, so any of them can), and starts the writers and
// readers. Each server's goroutines wait for that server's first /readyz 200
// before their first request: a destination kube-apiserver only serves once
// its etcd members are ready, and requests it could not have served are not
// failures of the move. ctx bounds the start only: the traffic runs until
// Stop, however long the move takes.
func (l *Load) Start(ctx context.Context) error {
	l.mu.Lock()
	if l.started || l.stopped {
		l.mu.Unlock()
		return errors.New("apiload: Start may be called once, before Stop")
	}
	l.started = true
	l.mu.Unlock()

	probeCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.stopProbes = cancel
	anyReady := make(chan *server, len(l.servers))
	for _, s := range l.servers {
		l.done.Add(1)
		go l.pollReadyz(probeCtx, s, anyReady)
	}
	var first *server
	select {
	case first = <-anyReady:
	case <-ctx.Done():
		l.Stop()
		return fmt.Errorf("apiload: no kube-apiserver answered /readyz with 200: %w", ctx.Err())
	}

	initial, err := l.createObjects(ctx, first)
	if err != nil {
		l.Stop()
		return err
	}
	l.mu.Lock()
	l.history = workload.NewHistory(initial)
	l.trafficAt = l.now()
	if !slices.ContainsFunc(l.marks, func(m Mark) bool { return m.Phase }) {
		l.marks = append(l.marks, Mark{At: l.trafficAt, Name: l.opts.InitialPhase, Phase: true})
	}
	l.mu.Unlock()

	perServer := l.opts.Writers + l.opts.Readers
	for _, s := range l.servers {
		for _, obj := range s.objects {
			s.cache.observe(obj.key, initial[obj.key])
		}
		for i := range l.opts.Writers {
			l.done.Add(1)
			go l.runWriter(s, s.index*perServer+i)
		}
		for i := range l.opts.Readers {
			l.done.Add(1)
			go l.runReader(s, s.index*perServer+l.opts.Writers+i)
		}
	}
	return nil
}

// createObjects creates the namespace and every ConfigMap through s and
// returns the objects' state as the history's initial state. An object
// left by an earlier run in the same namespace is taken as it is.
func (l *Load) createObjects(ctx context.Context, s *server) (map[string]workload.KeyValue, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: l.opts.Namespace}}
	if _, err := s.clients.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("apiload: creating namespace %s through %s: %w", l.opts.Namespace, s.name, err)
	}
	cms := s.clients.CoreV1().ConfigMaps(l.opts.Namespace)
	initial := make(map[string]workload.KeyValue, len(l.objects))
	for _, obj := range l.objects {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: obj.name, Namespace: l.opts.Namespace},
			Data:       map[string]string{valueKey: fmt.Sprintf("initial-%s-%s", obj.name, l.tag)},
		}
		created, err := cms.Create(ctx, cm, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			created, err = cms.Get(ctx, obj.name, metav1.GetOptions{})
		}
		if err != nil {
			return nil, fmt.Errorf("apiload: creating ConfigMap %s through %s: %w", obj.key, s.name, err)
		}
		kv, err := keyValue(created)
		if err != nil {
			return nil, fmt.Errorf("apiload: ConfigMap %s: %w", obj.key, err)
		}
		initial[obj.key] = kv
	}
	return initial, nil
}

// Stop ends the traffic: goroutines still waiting for their server's
// readiness return at once; requests in flight finish, each within
// RequestTimeout, and are recorded.
func (l *Load) Stop() {
	l.signalStop()
	l.done.Wait()
}

func (l *Load) signalStop() {
	l.stopOnce.Do(func() {
		l.mu.Lock()
		l.stopped, l.stopAt = true, l.now()
		cancel := l.stopProbes
		l.mu.Unlock()
		close(l.stopping)
		if cancel != nil {
			cancel()
		}
	})
}

// pause waits d, or returns false when the load is stopping.
func (l *Load) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.stopping:
		return false
	case <-t.C:
		return true
	}
}

// awaitReady blocks until s answered /readyz 200 or its clients were
// switched to another server, or returns false when the load is stopping
// first. A switch ends the wait at once: Switch only moves clients to a
// server that answered 200, and that server's readiness is what they now
// depend on.
func (l *Load) awaitReady(s *server) bool {
	select {
	case <-s.ready:
		return true
	case <-s.switched:
		return true
	case <-l.stopping:
		return false
	}
}

// record appends a finished request and, when given, the history
// operation it completes (a conflict's operation ends with the read after
// it).
func (l *Load) record(req Request, op *workload.Op) {
	l.mu.Lock()
	l.requests = append(l.requests, req)
	h := l.history
	l.mu.Unlock()
	if op != nil {
		h.Record(*op)
	}
	if req.Failed() {
		l.log.Info("request failed", "server", req.Server, "origin", req.Origin, "op", req.Kind.String(), "object", req.Object,
			"code", req.Code, "class", req.Class, "error", req.Err, "latency", req.Latency())
	}
}

// Mark is a caller-named point in time on the load's clock: a phase start
// (MarkPhase) or an event (Mark).
type Mark struct {
	At    time.Duration `json:"atNs"`
	Name  string        `json:"name"`
	Phase bool          `json:"phase,omitempty"`
}
