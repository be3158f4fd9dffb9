// Package sidecarcluster is the layer that the membership controller and the
// standalone rebalancer share between the planner and the sidecars: it
// observes an etcd cluster through a list of sidecars, turns what it saw into
// the planner's input, and executes one planner step through a sidecar under
// the cluster's membership lock, recording retirements in etcd so that two
// controllers of one etcd cluster never undo each other's removals.
//
// A caller runs rounds: Observe, Plan, and for a change Execute; then it
// observes again. Nothing is carried from one round to the next except what
// the caller keeps on purpose (learner Progress, an Uncertain step), so a
// caller that crashes anywhere resumes by simply starting a new round.
package sidecarcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// Config configures a Cluster. Zero durations take the defaults named.
type Config struct {
	// Holder names the caller in the membership lock and in the retirement
	// records it writes. It must stay the same across restarts of the
	// caller: a restarted caller then finds the lock and the records its
	// own. Letters, digits, '.', '_' and '-'.
	Holder string
	// TLS is the client TLS towards the sidecars: the CA that signed their
	// serving certificates and the client certificate that mutating calls
	// need. Nil for plain http.
	TLS *tls.Config
	// DialContext, when set, makes every connection to a sidecar (the test
	// sites reach their pods' network namespaces through it).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// ObserveTimeout bounds one GET /v1/members (default 5 s; the sidecar
	// polls every member with a 1 s limit).
	ObserveTimeout time.Duration
	// ObserveStagger is how long Observe waits for one sidecar before it
	// asks the next one as well (default 1 s).
	ObserveStagger time.Duration
	// CallTimeout bounds one mutating call (default 30 s, longer than the
	// sidecar's own etcd timeout, so that its answer arrives rather than a
	// client timeout that leaves the outcome unknown).
	CallTimeout time.Duration
	// LockTTL is the lease of the membership lock (default 60 s): another
	// holder takes the lock over this long after a holder's last renewal
	// when that holder died (a restarted process of the same holder takes
	// it over at once). It must be longer than CallTimeout: the lock is
	// renewed once half of it has passed, and the sidecar refuses a change
	// under a lock that runs out sooner than a call may take.
	LockTTL time.Duration
	// MaxLearnerLag is how many raft entries a learner may be behind the
	// leader and count as caught up (default 1000, the sidecar's figure).
	MaxLearnerLag uint64
	// Settle is how long after an uncertain step an observation that does
	// not show its effect counts as proof that it did not happen (default
	// 10 s: etcd applies or drops a proposal within a few election
	// timeouts).
	Settle time.Duration
	// FailureMemory is how long a sidecar that failed is tried after the
	// others (default 30 s).
	FailureMemory time.Duration
	// Logger receives one line per call that changes something.
	Logger logr.Logger
	// LocalSide is the side (planner.Member.Side) of the members beside
	// the caller, "" for none: a removal goes through a follower there
	// when it has a choice between followers of the same rank, one hop
	// less for the call.
	LocalSide string
	// OnStep, when set, is told about each change Execute sends through a
	// sidecar: with a nil Result right before the call (after the lock and
	// the retirement record), and with the call's Result right after it. It
	// runs on the caller's goroutine, so an observer can act before the
	// change reaches etcd (the demo drops a member from its clients'
	// endpoints before its removal) and time each step; keep it short.
	OnStep func(step planner.Step, res *Result)
}

func (c *Config) setDefaults() {
	if c.ObserveTimeout <= 0 {
		c.ObserveTimeout = 5 * time.Second
	}
	if c.ObserveStagger <= 0 {
		c.ObserveStagger = time.Second
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 30 * time.Second
	}
	if c.LockTTL <= 0 {
		c.LockTTL = 60 * time.Second
	}
	if c.MaxLearnerLag == 0 {
		c.MaxLearnerLag = 1000
	}
	if c.Settle <= 0 {
		c.Settle = 10 * time.Second
	}
	if c.FailureMemory <= 0 {
		c.FailureMemory = 30 * time.Second
	}
	if c.Logger.GetSink() == nil {
		c.Logger = logr.Discard()
	}
}

// Endpoint is one sidecar through which the cluster is reached.
type Endpoint struct {
	// Member is the name of the etcd member the sidecar runs beside; empty
	// when unknown. A step is never sent through the sidecar of the member
	// it removes.
	Member string
	// URL is the sidecar's base URL.
	URL string
	// TLS, when set, replaces Config.TLS towards this sidecar: the client
	// TLS of the Etcd it serves (its own CA), where one controller serves
	// Etcds of different CAs.
	TLS *tls.Config
}

func (e Endpoint) String() string {
	if e.Member == "" {
		return e.URL
	}
	return fmt.Sprintf("%s (%s)", e.Member, e.URL)
}

// EndpointError is why one sidecar gave no usable answer.
type EndpointError struct {
	Endpoint Endpoint
	Err      error
}

func (e EndpointError) Error() string { return fmt.Sprintf("sidecar of %s: %v", e.Endpoint, e.Err) }

// UnreachableError says that no sidecar answered; it names each and why.
type UnreachableError struct {
	Failures []EndpointError
}

func (e *UnreachableError) Error() string {
	if len(e.Failures) == 0 {
		return "no sidecar to ask: the endpoint list is empty"
	}
	parts := make([]string, len(e.Failures))
	for i, f := range e.Failures {
		parts[i] = f.Error()
	}
	return "no sidecar answered: " + strings.Join(parts, "; ")
}

// Cluster reaches one etcd cluster through its sidecars. It is safe for
// concurrent use; one Cluster can serve many etcd clusters, since it keeps
// nothing per cluster but sidecar clients and recent sidecar failures.
type Cluster struct {
	cfg Config
	// token names this process in the membership lock: new with every
	// Cluster and sorted by its start, so a restarted controller takes its
	// holder's lock over and fences off whatever its predecessor might
	// still send.
	token string

	mu      sync.Mutex
	clients map[string]cachedClient
	failed  map[string]failure // by sidecar URL
	// fenced is set once a sidecar refused this Cluster's token as stale:
	// a newer process of the holder took the lock over, and this Cluster
	// changes nothing more.
	fenced bool
	// drained are the members (by ID) whose client gates this Cluster
	// closed for their removal, and when.
	drained map[string]time.Time
	// down is, for each member (by ID) seen unhealthy in its latest
	// observation, when the break began and when it was last seen (Input).
	down map[string]downBreak
}

// downBreak is a member's time without a healthy poll.
type downBreak struct{ since, seen time.Time }

// New returns a Cluster for the given configuration.
func New(cfg Config) (*Cluster, error) {
	cfg.setDefaults()
	if cfg.Holder == "" {
		return nil, errors.New("membership: Config.Holder is empty; it names the caller in the membership lock")
	}
	for i, r := range cfg.Holder {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_'
		if !ok {
			return nil, fmt.Errorf("membership: holder %q has the character %q at position %d; allowed are letters, digits, '-', '.' and '_'", cfg.Holder, r, i)
		}
	}
	if cfg.LockTTL <= cfg.CallTimeout {
		return nil, fmt.Errorf("membership: the lock TTL (%s) must be longer than the call timeout (%s), so that a change sent under the lock ends before the lock can pass to another holder", cfg.LockTTL, cfg.CallTimeout)
	}
	// The token names the process's start: only a newer process takes its
	// holder's lock over.
	token, err := sidecar.NewLockToken(time.Now())
	if err != nil {
		return nil, fmt.Errorf("membership: a lock token: %w", err)
	}
	return &Cluster{cfg: cfg, token: token, clients: map[string]cachedClient{}, failed: map[string]failure{}, drained: map[string]time.Time{}, down: map[string]downBreak{}}, nil
}

// Holder is the name this Cluster uses in the lock and retirement records.
func (c *Cluster) Holder() string { return c.cfg.Holder }

// Token names this Cluster's process in the membership lock.
func (c *Cluster) Token() string { return c.token }

// client returns the cached client of a sidecar URL, so that connections
// (and their TLS sessions) are reused across rounds.
// t, when not nil, is the sidecar's own client TLS (Endpoint.TLS): a
// client made with another one (its Etcd's CA was renewed) is replaced.
func (c *Cluster) client(url string, t *tls.Config) *sidecar.Client {
	if t == nil {
		t = c.cfg.TLS
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cached, ok := c.clients[url]; ok {
		if cached.tls == t {
			return cached.client
		}
		cached.client.CloseIdleConnections()
	}
	opts := []sidecar.ClientOption{sidecar.WithTimeout(c.cfg.CallTimeout)}
	if c.cfg.DialContext != nil {
		opts = append(opts, sidecar.WithDialContext(c.cfg.DialContext))
	}
	cl := sidecar.NewClient(url, t, opts...)
	c.clients[url] = cachedClient{client: cl, tls: t}
	return cl
}

// cachedClient is a sidecar's client and the TLS it was made with.
type cachedClient struct {
	client *sidecar.Client
	tls    *tls.Config
}

// failure is a sidecar's last failure.
type failure struct {
	at time.Time
	// overtaken: it only answered an observation later than another. A
	// sidecar across sites always does, and that says nothing against
	// sending it a step.
	overtaken bool
}

func (c *Cluster) noteFailure(e Endpoint, failed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if failed {
		c.failed[e.URL] = failure{at: time.Now()}
	} else {
		delete(c.failed, e.URL)
	}
}

// noteOvertaken notes a sidecar that answered an observation later than
// another: asked after the others for FailureMemory, like a failed one,
// but not refused a step (see erredRecently).
func (c *Cluster) noteOvertaken(e Endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.recentLocked(e); ok && !f.overtaken {
		return // an error stays one until it is forgotten
	}
	c.failed[e.URL] = failure{at: time.Now(), overtaken: true}
}

// recentLocked is e's failure within FailureMemory. c.mu must be held.
func (c *Cluster) recentLocked(e Endpoint) (failure, bool) {
	f, ok := c.failed[e.URL]
	return f, ok && time.Since(f.at) < c.cfg.FailureMemory
}

// erredRecently tells whether a call to e's sidecar failed within
// FailureMemory, other than by being overtaken.
func (c *Cluster) erredRecently(e Endpoint) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.recentLocked(e)
	return ok && !f.overtaken
}

// failedRecently tells whether e's sidecar failed or was overtaken within
// FailureMemory.
func (c *Cluster) failedRecently(e Endpoint) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.recentLocked(e)
	return ok
}

// Hint orders the sidecars to ask.
type Hint struct {
	// Healthy are members last seen as healthy voters: their sidecars are
	// asked first, since they answer at once.
	Healthy []string
	// Departing are members on their way out: their sidecars are asked
	// last, and a removal is never sent through them.
	Departing []string
	// Learners are members last seen as learners: their sidecars are
	// asked last, even after voters' that failed or were slow lately,
	// since a learner's sidecar cannot tell how long the voters'
	// transports have had a learner connected (the evidence a promotion
	// before the learner serves clients needs).
	Learners []string
	// Leader is the member last seen leading: its sidecar is asked first,
	// even when the member departs (the leader is never removed). Every
	// change goes to the leader's sidecar (Execute), and etcd checks a
	// change with the leader's view of its raft transport: a plan made
	// from another member's view was refused there when the two views of
	// a learner's connection differed by a fraction of a second.
	Leader string
}

// Observation is the cluster as one sidecar reported it.
type Observation struct {
	// List is the sidecar's answer: members with health, leader,
	// fingerprint, lock and retirement records.
	List *sidecar.MemberList
	// Via is the sidecar that answered.
	Via Endpoint
	// At is when the answer arrived.
	At time.Time
	// Began is when Observe began asking.
	Began time.Time
	// Failures are the sidecars asked before Via, and why they failed.
	Failures []EndpointError
	// Configured is, by lower-case member ID, how long before the
	// observation each learner that had not started its raft had run etcd
	// with the configuration it joins with, as its sidecar told Admit.
	// Absent when unknown: not asked, not answered, or not taken yet.
	Configured map[string]time.Duration
}

// Member returns the observed member with the given name or hex ID.
func (o *Observation) Member(nameOrID string) *sidecar.Member {
	if nameOrID == "" {
		return nil
	}
	for i := range o.List.Members {
		if m := &o.List.Members[i]; m.Name == nameOrID || strings.EqualFold(m.ID, nameOrID) {
			return m
		}
	}
	return nil
}

// LockedBy reports whether holder's process with token held the
// membership lock when observed.
func (o *Observation) LockedBy(holder, token string) bool {
	return o.List.Lock != nil && o.List.Lock.Holder == holder && o.List.Lock.Token == token
}

// Observe asks the sidecars in the order of the hint (healthy members
// first, then the given order, departing members and those that failed
// recently later, learners last) and returns the first answer. A sidecar that has not
// answered within ObserveStagger gets company: the next one is asked too, and
// whichever answers first wins, so one hanging sidecar (a pod that is not
// serving yet) delays an observation by the stagger, not by a timeout. A
// sidecar overtaken that way counts as failed for FailureMemory.
func (c *Cluster) Observe(ctx context.Context, endpoints []Endpoint, hint Hint) (*Observation, error) {
	began := time.Now()
	order := c.order(endpoints, hint)
	if len(order) == 0 {
		return nil, &UnreachableError{}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		i    int
		list *sidecar.MemberList
		err  error
	}
	answers := make(chan answer, len(order))
	launched, inFlight := 0, 0
	launch := func() {
		i := launched
		launched++
		inFlight++
		go func() {
			callCtx, done := context.WithTimeout(ctx, c.cfg.ObserveTimeout)
			defer done()
			cl := c.client(order[i].URL, order[i].TLS)
			list, err := cl.Members(callCtx)
			if err == nil {
				err = ownMemberListed(order[i], list)
			}
			if err == nil {
				if err = answersFor(order[i], list); err != nil {
					cl.CloseIdleConnections()
				}
			}
			answers <- answer{i: i, list: list, err: err}
		}()
	}
	launch()
	stagger := time.NewTimer(c.cfg.ObserveStagger)
	defer stagger.Stop()
	failed := map[int]error{}
	for inFlight > 0 || launched < len(order) {
		select {
		case a := <-answers:
			inFlight--
			if a.err == nil {
				c.noteFailure(order[a.i], false)
				for i := range launched {
					if _, done := failed[i]; !done && i != a.i {
						c.noteOvertaken(order[i])
					}
				}
				obs := &Observation{List: a.list, Via: order[a.i], At: time.Now(), Began: began}
				for i := range launched {
					if err, ok := failed[i]; ok {
						obs.Failures = append(obs.Failures, EndpointError{Endpoint: order[i], Err: err})
					}
				}
				return obs, nil
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("observing the cluster: %w", ctx.Err())
			}
			failed[a.i] = a.err
			c.noteFailure(order[a.i], true)
			if launched < len(order) {
				launch() // a refusal is an answer: no need to wait for the stagger
				stagger.Reset(c.cfg.ObserveStagger)
			}
		case <-stagger.C:
			if launched < len(order) {
				launch()
			}
			stagger.Reset(c.cfg.ObserveStagger)
		case <-ctx.Done():
			return nil, fmt.Errorf("observing the cluster: %w", ctx.Err())
		}
	}
	u := &UnreachableError{}
	for i := range order {
		u.Failures = append(u.Failures, EndpointError{Endpoint: order[i], Err: failed[i]})
	}
	return nil, u
}

// ownMemberListed refuses the answer of a sidecar whose own member is not
// in the list it gives: that member was removed, and what it sees of the
// cluster is no longer to be trusted.
func ownMemberListed(e Endpoint, list *sidecar.MemberList) error {
	if e.Member == "" {
		return nil
	}
	for _, m := range list.Members {
		if m.Name == e.Member {
			return nil
		}
	}
	return fmt.Errorf("its own member %s is not in the member list it reports (removed?)", e.Member)
}

// answersFor refuses the answer of a sidecar that is not beside the
// endpoint's member: the member whose transport it reports (its own) has
// another name. Both seeds of a GEP-39 move run the Etcd under one name and
// namespace, so a pod's in-cluster name can lead to the other seed's pod of
// that name (a DNS answer, or a connection kept from when it did); that
// sidecar's view is sound, but taken as the endpoint's member's it would
// route that member's steps and admissions to the wrong pod. The caller
// drops the connection, so that the next call dials afresh.
func answersFor(e Endpoint, list *sidecar.MemberList) error {
	if e.Member == "" || list.TransportOf == "" {
		return nil
	}
	for _, m := range list.Members {
		if strings.EqualFold(m.ID, list.TransportOf) && m.Name != "" && m.Name != e.Member {
			return fmt.Errorf("it answers for member %s, not for %s: its address leads to another pod (a name two pods share, or a connection kept from when it did)", m.Name, e.Member)
		}
	}
	return nil
}

// order sorts the endpoints by preference, keeping the given order among
// equals and dropping duplicate URLs.
func (c *Cluster) order(endpoints []Endpoint, hint Hint) []Endpoint {
	rank := func(e Endpoint) int {
		if hint.Leader != "" && e.Member == hint.Leader && !c.erredRecently(e) {
			// Another sidecar answering first once (overtaken) does not
			// count against the leader's.
			return -1
		}
		r := 0
		if c.failedRecently(e) {
			r += 4
		}
		if slices.Contains(hint.Departing, e.Member) {
			r += 2
		}
		if slices.Contains(hint.Learners, e.Member) {
			r += 8 // after a voter's sidecar that was slow lately, too
		}
		if !slices.Contains(hint.Healthy, e.Member) {
			r++
		}
		return r
	}
	seen := map[string]bool{}
	out := make([]Endpoint, 0, len(endpoints))
	for _, e := range endpoints {
		if e.URL != "" && !seen[e.URL] {
			seen[e.URL] = true
			out = append(out, e)
		}
	}
	slices.SortStableFunc(out, func(a, b Endpoint) int { return rank(a) - rank(b) })
	return out
}
