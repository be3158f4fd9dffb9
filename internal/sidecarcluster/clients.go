package sidecarcluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// ReasonDrainFailed: the member to remove still had clients, because its
// sidecar's gate could not drain them; the removal is not sent.
const ReasonDrainFailed = "ClientDrainFailed"

// LeaderTransferHold is how long the members' gates hold new calls for a
// leader transfer at most. MoveLeader takes 0.2 s within a site and 0.6 s
// across sites at 180 ms RTT, and each hold ends as soon as its member sees
// the new leader, or when the controller releases it once MoveLeader
// answered; the ceiling only bounds the stall of a controller that dies in
// between. It is the sidecar's largest: on a busy machine the transfer
// began 1.4 s after the holds, and a 2 s ceiling ran out while it ran (the
// calls it let through were dropped, "raft proposal dropped").
const LeaderTransferHold = sidecar.MaxClientHold

// holdCallTimeout bounds a hold call: a gate that has not answered by then
// is left, since the transfer waits for every answer.
const holdCallTimeout = 2 * time.Second

// drainTimeout bounds a drain: the calls in flight at the member and a
// second for its clients to leave. A sidecar that takes longer counts as
// one that does not answer, so a hung pod cannot hold its member's removal
// for a whole call timeout.
const drainTimeout = 5 * time.Second

// DrainLease is how long a member's clients stay drained unless the
// controller renews the drain: it renews it while the step that removes
// the member runs, and undoes it when the removal does not come. A
// controller that dies, or an undo that is lost, leaves the member
// drained for this long at most (the sidecar reopens the gate by itself:
// sidecar.ClientDrain).
const DrainLease = 10 * time.Second

// drainRenewal is how often a drain is renewed while its step runs: a
// third of its lease, so that one lost renewal does not end it.
var drainRenewal = DrainLease / 3

// drain is a drain of a member's clients made for its removal.
type drain struct {
	c      *Cluster
	cl     *sidecar.Client
	member string
	id     string
	stop   chan struct{}
	done   chan struct{}
}

// drainClients moves the clients of member (etcd's ID id), which the step
// removes, to other members through its sidecar's client gate: a member
// nobody talks to is removed without failing a client's call
// (kube-apiserver does not retry a write once sent). A sidecar without a
// gate, or one that does not answer, is passed by (nil drain): the
// removal goes on as etcd alone would do it. A sidecar that answers with
// a refusal postpones the removal (the drain it returns then undoes
// whatever the refused drain left). A drained member is remembered
// (noteDrained), and its drain is renewed until the step ends (end).
func (c *Cluster) drainClients(ctx context.Context, endpoints []Endpoint, member, id string) (*drain, error) {
	for _, e := range endpoints {
		if e.Member != member || e.URL == "" {
			continue
		}
		callCtx, cancel := context.WithTimeout(ctx, min(c.cfg.CallTimeout, drainTimeout))
		start := time.Now()
		cl := c.client(e.URL, e.TLS)
		_, err := cl.DrainClients(callCtx, sidecar.ClientDrain{Seconds: DrainLease.Seconds()}, c.gateOptions())
		cancel()
		var refused *sidecar.Error
		switch {
		case sidecar.IsReason(err, sidecar.ReasonNoClientGate):
			return nil, nil
		case errors.As(err, &refused):
			d := &drain{c: c, cl: cl, member: member, id: id}
			return d, fmt.Errorf("draining the clients of %s before its removal: %w", member, err)
		case err != nil:
			// A sidecar that does not answer cannot drain, and a member
			// whose pod is gone must still go: the removal proceeds as
			// etcd alone would do it.
			c.cfg.Logger.Info("could not reach the sidecar to drain a member's clients; removing it without", "member", member, "error", err.Error())
			return nil, nil
		}
		c.cfg.Logger.Info("drained the clients of a member before its removal", "member", member, "took", time.Since(start).String())
		c.noteDrained(id, start)
		d := &drain{c: c, cl: cl, member: member, id: id, stop: make(chan struct{}), done: make(chan struct{})}
		go d.renew(context.WithoutCancel(ctx))
		return d, nil
	}
	// No sidecar of the member is known (an external member of another
	// cluster whose sidecar is not listed): nothing to drain through.
	return nil, nil
}

// gateOptions are the lock headers of drain and hold calls: the sidecar
// drains or holds a member's clients only for the lock's holder.
func (c *Cluster) gateOptions() sidecar.CallOptions {
	return sidecar.CallOptions{LockHolder: c.cfg.Holder, LockToken: c.token}
}

// renew renews the drain's lease until stop.
func (d *drain) renew(ctx context.Context) {
	defer close(d.done)
	t := time.NewTicker(drainRenewal)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		callCtx, cancel := context.WithTimeout(ctx, min(d.c.cfg.CallTimeout, drainRenewal))
		_, err := d.cl.DrainClients(callCtx, sidecar.ClientDrain{Seconds: DrainLease.Seconds(), Renew: true}, d.c.gateOptions())
		cancel()
		if sidecar.IsReason(err, sidecar.ReasonNotDrained) {
			d.c.cfg.Logger.Info("the sidecar ended the drain of a member's clients (its lease ran out, or the member leads); not renewed", "member", d.member)
			return
		}
		if err != nil {
			d.c.cfg.Logger.Info("could not renew the drain of a member's clients; it ends with its lease unless renewed", "member", d.member, "error", err.Error())
		}
	}
}

// end ends the drain's renewal once its step is over, and undoes the
// drain unless the member's removal happened or may have happened (an
// uncertain outcome: the sidecar keeps a gate drained while the removal
// is under way, and ends it with its lease otherwise). A drain whose
// removal does not come must not stay: its member still votes, serves no
// client and, once it leads, could never be led away from.
func (d *drain) end(removed bool) {
	if d == nil {
		return
	}
	if d.stop != nil {
		close(d.stop)
		<-d.done
	}
	if removed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(d.c.cfg.CallTimeout, drainTimeout))
	defer cancel()
	if _, err := d.cl.UndrainClients(ctx, d.c.gateOptions()); err != nil {
		d.c.cfg.Logger.Info("could not undo the drain of a member whose removal did not happen; its sidecar ends it with its lease", "member", d.member, "lease", DrainLease.String(), "error", err.Error())
		return
	}
	d.c.cfg.Logger.Info("undid the drain of a member whose removal did not happen: it takes clients again", "member", d.member)
	d.c.forgetDrained(d.id)
}

// drainKept tells whether the step's result leaves the drained member
// drained: its removal happened, or its outcome is unknown.
func drainKept(plan Plan, res Result) bool {
	switch res.Outcome {
	case Uncertain:
		return true
	case Succeeded:
		return plan.Step.Kind == planner.Remove || res.ThenRemoved
	}
	return false
}

// drainedMemory is how long a drained member is remembered: its removal
// follows within seconds, or is planned again within a few rounds.
const drainedMemory = 10 * time.Minute

// noteDrained remembers that the gate of member id was closed at.
//
// A drained gate takes no connection again, so every poll of that member
// fails from then on. When the step that was to remove it does not happen
// (etcd refused the promotion it came with, say), the member stays a voter
// whose raft is connected but which answers no poll, and the planner's
// health gate would wait for it forever (WaitingForHealthyCluster): its
// removal, the one step that would end the wait, is a change the gate
// holds. Input counts such a member as healthy instead: its etcd runs and
// votes, and what does not answer is the gate this Cluster closed.
func (c *Cluster) noteDrained(id string, at time.Time) {
	if id == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, t := range c.drained {
		if at.Sub(t) > drainedMemory {
			delete(c.drained, k)
		}
	}
	c.drained[strings.ToLower(id)] = at
}

// forgetDrained forgets that member id was drained: its drain was undone.
func (c *Cluster) forgetDrained(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.drained, strings.ToLower(id))
}

// wasDrained tells whether this Cluster drained member id within
// drainedMemory before now.
func (c *Cluster) wasDrained(id string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.drained[strings.ToLower(id)]
	return ok && now.Sub(t) <= drainedMemory
}

// holdClients makes every member's gate hold new calls until release is
// called, or until its member reports transferee (a member ID in hex, empty
// for none) as its leader, and returns once the calls in flight at each
// gate are answered: during the leader transfer that follows, no proposal
// is on its way to the old leader, which would drop it (silently, when a
// follower forwarded it: its client then waits out etcd's request
// timeout). Each gate ending its own hold when its member sees the new
// leader spares its clients the round trips of the transfer's answer and
// of the release, across sites two of them. A gate that cannot be held is
// logged and left: the transfer goes on, as etcd alone would do it.
//
// The gates of the members for which holdLast is true (the transferee's
// side) are held only once the others hold: their clients are the ones
// the transfer serves first, and holding them while the holds of the other
// side travel (a round trip across sites) would only lengthen their stall.
func (c *Cluster) holdClients(ctx context.Context, endpoints []Endpoint, transferee string, holdLast func(Endpoint) bool) (release func()) {
	c.warmConnections(ctx, endpoints)
	var first, last []Endpoint
	for _, e := range endpoints {
		switch {
		case e.URL == "":
		case holdLast(e):
			last = append(last, e)
		default:
			first = append(first, e)
		}
	}
	held := c.hold(ctx, first, transferee)
	held = append(held, c.hold(ctx, last, transferee)...)
	return func() {
		var wg sync.WaitGroup
		for _, cl := range held {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Not the step's context: a hold must end even when the
				// reconcile that took it was cancelled (it also ends by
				// itself after LeaderTransferHold).
				callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CallTimeout)
				defer cancel()
				if err := cl.ReleaseClients(callCtx, c.gateOptions()); err != nil {
					c.cfg.Logger.Info("could not release a member's clients after the leader transfer; the hold ends by itself", "error", err.Error())
				}
			}()
		}
		wg.Wait()
	}
}

// hold holds the gates of endpoints at once and returns the clients of
// those that hold.
func (c *Cluster) hold(ctx context.Context, endpoints []Endpoint, transferee string) []*sidecar.Client {
	var (
		mu   sync.Mutex
		held []*sidecar.Client
		wg   sync.WaitGroup
	)
	for _, e := range endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := c.client(e.URL, e.TLS)
			callCtx, cancel := context.WithTimeout(ctx, min(c.cfg.CallTimeout, holdCallTimeout))
			defer cancel()
			_, err := cl.HoldClients(callCtx, sidecar.ClientHold{Seconds: LeaderTransferHold.Seconds(), UntilLeader: transferee},
				c.gateOptions())
			switch {
			case sidecar.IsReason(err, sidecar.ReasonNoClientGate):
			case err != nil:
				c.cfg.Logger.Info("could not hold a member's clients for the leader transfer", "sidecar", e.String(), "error", err.Error())
			default:
				mu.Lock()
				held = append(held, cl)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return held
}

// warmConnections makes sure a connection to every sidecar is open before
// the clients are held: a sidecar the controller has not called lately
// (another site's, whose member it does not observe through) would
// otherwise cost a TCP handshake inside the hold, a round trip across
// sites. The answers do not matter, so the sidecar is asked what it
// answers at once (/healthz): /readyz asks its etcd member, and a member
// that does not serve yet (one promoted right after its snapshot join)
// held the warm-up, and the transfer, for that read's 1 s timeout.
func (c *Cluster) warmConnections(ctx context.Context, endpoints []Endpoint) {
	var wg sync.WaitGroup
	for _, e := range endpoints {
		if e.URL == "" {
			continue
		}
		wg.Go(func() {
			callCtx, cancel := context.WithTimeout(ctx, min(c.cfg.CallTimeout, warmTimeout))
			defer cancel()
			_ = c.client(e.URL, e.TLS).Healthy(callCtx)
		})
	}
	wg.Wait()
}

// warmTimeout bounds the wait for a connection warmed before a hold: a
// sidecar that takes longer is held cold, or not at all.
const warmTimeout = 2 * time.Second
