package demo

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
)

// routeInterval is how often the client's endpoints are brought in line
// with the ready voters.
const routeInterval = 250 * time.Millisecond

// startTrafficTimeout bounds StartTraffic's wait for a ready voter.
const startTrafficTimeout = 30 * time.Second

// readyProbeTimeout bounds one readiness probe of a member.
const readyProbeTimeout = 500 * time.Millisecond

// Traffic is the client workload with its routing: it sends requests only
// to voters whose readiness passes (a member that caught up by snapshot may
// not serve for many seconds, and a learner serves no linearizable request),
// and drops a member from its endpoints before the member's removal is sent
// (etcd 3.6 must not serve a request while it applies its own removal).
type Traffic struct {
	// Workload is the client traffic and its record.
	Workload *workload.Workload

	env    *Env
	stop   context.CancelFunc
	done   chan struct{}
	unhook func()

	mu sync.Mutex
	// removing are the IDs of members whose removal is about to be sent or
	// was sent: never routed to again. By ID, not URL: a member added back
	// under the same name (an abort) has a new ID and serves again.
	removing map[string]bool
	current  []endpoint
}

// endpoint is a voter the client may send requests to.
type endpoint struct{ URL, ID string }

func urls(eps []endpoint) []string {
	out := make([]string, len(eps))
	for i, ep := range eps {
		out[i] = ep.URL
	}
	return out
}

// StartTraffic starts the workload against the ready voters of the cluster
// (o.Endpoints and o.TLS are filled in) and keeps its endpoints routed. It
// preloads o.PreloadKeys keys first. Stop it with Stop.
func (e *Env) StartTraffic(ctx context.Context, o workload.Options) (*Traffic, error) {
	t := &Traffic{env: e, removing: map[string]bool{}}
	// A member answers its first probes late on a busy machine (each is a
	// new TLS connection and a linearizable read): the traffic waits for
	// a ready voter, up to startTrafficTimeout.
	var eps []endpoint
	var err error
	if perr := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, startTrafficTimeout, true, func(ctx context.Context) (bool, error) {
		eps, err = t.readyVoters(ctx)
		return err != nil || len(eps) > 0, nil
	}); err != nil {
		return nil, err
	} else if perr != nil {
		return nil, fmt.Errorf("no ready voter to send client traffic to within %s: %w", startTrafficTimeout, perr)
	}
	o.Endpoints, o.TLS = urls(eps), e.ClientTLS
	if o.Log.GetSink() == nil {
		o.Log = e.Config.Logger.WithName("workload")
	}
	t.current = eps
	if t.Workload, err = workload.New(o); err != nil {
		return nil, err
	}
	if _, err := t.Workload.Preload(ctx); err != nil {
		_ = t.Workload.Close()
		return nil, err
	}
	t.unhook = e.OnStep(t.beforeRemoval)
	if err := t.Workload.Start(ctx); err != nil {
		t.unhook()
		_ = t.Workload.Close()
		return nil, err
	}
	routeCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	t.stop, t.done = stop, make(chan struct{})
	go t.route(routeCtx)
	return t, nil
}

// Stop ends the routing and the traffic (requests in flight finish); the
// workload's client stays open for Verify.
func (t *Traffic) Stop() {
	t.stop()
	<-t.done
	t.unhook()
	t.Workload.Stop()
}

// Close stops the traffic and closes the workload's client.
func (t *Traffic) Close() error {
	t.Stop()
	return t.Workload.Close()
}

// beforeRemoval drops a member from the endpoints as soon as its removal
// is about to be sent, before the sidecar sends it.
func (t *Traffic) beforeRemoval(ev StepEvent) {
	if ev.Kind != planner.Remove || ev.Done() || ev.ID == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removing[strings.ToLower(ev.ID)] = true
	t.setEndpoints(t.current)
}

// setEndpoints routes the client to eps without the members being removed,
// unless that leaves none. The caller holds t.mu.
func (t *Traffic) setEndpoints(eps []endpoint) {
	keep := slices.DeleteFunc(slices.Clone(eps), func(ep endpoint) bool { return t.removing[ep.ID] })
	if len(keep) == 0 || slices.Equal(keep, t.current) {
		return
	}
	if err := t.Workload.SetEndpoints(urls(keep)...); err == nil {
		t.current = keep
	}
}

func (t *Traffic) route(ctx context.Context) {
	defer close(t.done)
	tick := time.NewTicker(routeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		eps, err := t.readyVoters(ctx)
		if err != nil || len(eps) == 0 {
			continue // keep the endpoints we have rather than none
		}
		// A removal may have been announced while the probes ran: filter
		// again under the lock, or a member about to apply its own removal
		// would be routed to again.
		t.mu.Lock()
		t.setEndpoints(eps)
		t.mu.Unlock()
	}
}

// readyVoters are the voters in the freshest observed membership whose
// removal was not sent and whose readiness passes, sorted by URL.
func (t *Traffic) readyVoters(ctx context.Context) ([]endpoint, error) {
	voters, err := t.env.observedVoters(ctx)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	var candidates []*localetcd.Member
	var ids []string
	for _, v := range voters {
		id := strings.ToLower(v.ID)
		if t.removing[id] {
			continue
		}
		if m := t.env.member(v.Name); m != nil {
			candidates, ids = append(candidates, m), append(ids, id)
		}
	}
	t.mu.Unlock()
	ready := make([]bool, len(candidates))
	var wg sync.WaitGroup
	for i, m := range candidates {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, readyProbeTimeout)
			defer cancel()
			ready[i] = m.WaitReady(pctx) == nil
		})
	}
	wg.Wait()
	var eps []endpoint
	for i, m := range candidates {
		if ready[i] {
			eps = append(eps, endpoint{URL: m.ClientURL, ID: ids[i]})
		}
	}
	slices.SortFunc(eps, func(a, b endpoint) int { return strings.Compare(a.URL, b.URL) })
	return eps, nil
}

// member is the running local etcd member of that name, in either cluster.
func (e *Env) member(name string) *localetcd.Member {
	if name == "" {
		return nil
	}
	for _, c := range e.Clusters() {
		if m := c.Runner.Runtime().Member(name); m != nil && m.Running() {
			return m
		}
	}
	return nil
}

// observedVoters are the voters of the more recent observation of the two
// controllers.
func (e *Env) observedVoters(ctx context.Context) ([]v1alpha1.ObservedMember, error) {
	src, dst, err := e.Read(ctx)
	if err != nil {
		return nil, err
	}
	var best *v1alpha1.Etcd
	for _, x := range []*v1alpha1.Etcd{src, dst} {
		if x == nil || x.Status.Membership == nil || x.Status.Membership.ObservedTime == nil {
			continue
		}
		if best == nil || x.Status.Membership.ObservedTime.After(best.Status.Membership.ObservedTime.Time) {
			best = x
		}
	}
	if best == nil {
		return nil, nil
	}
	var out []v1alpha1.ObservedMember
	for _, m := range best.Status.Membership.Members {
		if m.Votes() {
			out = append(out, m)
		}
	}
	return out, nil
}

// Read returns the Etcd in cluster A and in cluster B, each as
// druid-stretch's view with its EtcdMembership (nil where it does not
// exist).
func (e *Env) Read(ctx context.Context) (src, dst *v1alpha1.Etcd, err error) {
	get := func(c *Cluster) (*v1alpha1.Etcd, error) {
		p, err := etcdview.Get(ctx, c.Client, client.ObjectKey{Namespace: e.Config.Namespace, Name: e.Config.Name})
		if client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("reading the Etcd in cluster %s: %w", c.Name, err)
		}
		if err != nil {
			return nil, nil
		}
		return p.View, nil
	}
	if src, err = get(e.A); err != nil {
		return nil, nil, err
	}
	if dst, err = get(e.B); err != nil {
		return nil, nil, err
	}
	return src, dst, nil
}
