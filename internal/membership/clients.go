package membership

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/druid-stretch/druid-stretch/sidecar"
)

// ReasonDrainFailed: the member to remove still had clients, because its
// sidecar's gate could not drain them; the removal is not sent.
const ReasonDrainFailed = "ClientDrainFailed"

// LeaderTransferHold is how long the members' gates hold new calls for a
// leader transfer at most: MoveLeader takes 0.2 s within a site and 0.6 s
// across sites at 180 ms RTT, and the hold is released as soon as it
// answers.
const LeaderTransferHold = 2 * time.Second

// drainTimeout bounds a drain: the calls in flight at the member and a
// second for its clients to leave. A sidecar that takes longer counts as
// one that does not answer, so a hung pod cannot hold its member's removal
// for a whole call timeout.
const drainTimeout = 5 * time.Second

// drainClients moves the clients of member (etcd's ID id), which the step
// removes, to other members through its sidecar's client gate: a member
// nobody talks to is removed without failing a client's call
// (kube-apiserver does not retry a write once sent). A sidecar without a
// gate, or one that does not answer, is passed by: the removal goes on as
// etcd alone would do it. A sidecar that answers with a refusal postpones
// the removal. A drained member is remembered (noteDrained).
func (c *Cluster) drainClients(ctx context.Context, endpoints []Endpoint, member, id string) error {
	for _, e := range endpoints {
		if e.Member != member || e.URL == "" {
			continue
		}
		callCtx, cancel := context.WithTimeout(ctx, min(c.cfg.CallTimeout, drainTimeout))
		start := time.Now()
		_, err := c.client(e.URL).DrainClients(callCtx, sidecar.CallOptions{LockHolder: c.cfg.Holder})
		cancel()
		var refused *sidecar.Error
		switch {
		case sidecar.IsReason(err, sidecar.ReasonNoClientGate):
			return nil
		case errors.As(err, &refused):
			return fmt.Errorf("draining the clients of %s before its removal: %w", member, err)
		case err != nil:
			// A sidecar that does not answer cannot drain, and a member
			// whose pod is gone must still go: the removal proceeds as
			// etcd alone would do it.
			c.cfg.Logger.Info("could not reach the sidecar to drain a member's clients; removing it without", "member", member, "error", err.Error())
			return nil
		}
		c.cfg.Logger.Info("drained the clients of a member before its removal", "member", member, "took", time.Since(start).String())
		c.noteDrained(id, start)
		return nil
	}
	// No sidecar of the member is known (an external member of another
	// cluster whose sidecar is not listed): nothing to drain through.
	return nil
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
				if err := cl.ReleaseClients(callCtx, sidecar.CallOptions{LockHolder: c.cfg.Holder}); err != nil {
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
			cl := c.client(e.URL)
			// A gate that has not answered by the time the hold would have
			// ended by itself is of no use to the transfer, which waits
			// for this answer.
			callCtx, cancel := context.WithTimeout(ctx, min(c.cfg.CallTimeout, LeaderTransferHold))
			defer cancel()
			_, err := cl.HoldClients(callCtx, sidecar.ClientHold{Seconds: LeaderTransferHold.Seconds(), UntilLeader: transferee},
				sidecar.CallOptions{LockHolder: c.cfg.Holder})
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
			_ = c.client(e.URL).Healthy(callCtx)
		})
	}
	wg.Wait()
}

// warmTimeout bounds the wait for a connection warmed before a hold: a
// sidecar that takes longer is held cold, or not at all.
const warmTimeout = 2 * time.Second
